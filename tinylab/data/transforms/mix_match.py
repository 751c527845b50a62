"""--mix_match=features=Foreshadowing:Twist (or features:Foreshadowing=Twist): relabel the prompt.
Each KEY entry is a table of FROM=TO pairs; every element of the instruction's KEY list is mapped
once through it (A:B:B:A swaps, it does not chain). The story is unchanged."""
import re

from tinylab.core.errors import UserError
from tinylab.data.records import LIST_KEYS
from tinylab.data.transforms.base import Transform, register
from tinylab.data.transforms.grammar import check_key, check_value, entries


@register
class MixMatch(Transform):
    flag, code, always_named = "mix_match", "MM", True
    help = "e.g. features=Foreshadowing:Twist (relabel in the prompt)"
    example = "features=Foreshadowing:Twist:Twist:Foreshadowing"

    @classmethod
    def parse(cls, text):
        flag, swaps = "--mix_match", {}
        for entry in entries(flag, text):
            key, *values = re.split(r"[:=]", entry)
            check_key(flag, entry, key, LIST_KEYS)
            if not values or len(values) % 2:
                raise UserError(f"{flag}: '{entry}' needs KEY:FROM=TO pairs (e.g. features:Foreshadowing=Twist), "
                                f"got {len(values)} value(s)")
            if key in swaps:
                raise UserError(f"{flag}: key '{key}' appears in two entries; put all its pairs in one")
            swaps[key] = cls._table(flag, entry, key, values)
        return swaps

    @staticmethod
    def _table(flag, entry, key, values):
        table = {}
        for src, dst in zip(values[0::2], values[1::2]):
            check_value(flag, entry, key, src)
            check_value(flag, entry, key, dst)
            if src in table:
                raise UserError(f"{flag}: '{entry}' maps '{src}' twice")
            table[src] = dst
        return table

    @staticmethod
    def relabel(values: list, table: dict) -> list:
        """Every value mapped once through the table (--mix_match_pairs=original replaces this)."""
        return [table.get(v, v) for v in values]

    def apply(self, example, rng):
        instruction = example["instruction"]
        for key, table in self.value.items():
            instruction[key] = self.relabel(instruction[key], table)
        return example

    @classmethod
    def flag_text(cls, tokens):
        key, *values = tokens
        return f"{key}=" + ":".join(values)
