"""--instruction_subset=Words,Features: which header lines the template writes (Story always)."""
from tinylab.core.errors import UserError
from tinylab.data.records import closest
from tinylab.data.template import INSTRUCTION_KEYS
from tinylab.data.transforms.base import Transform, register
from tinylab.data.transforms.grammar import entries


@register
class InstructionSubset(Transform):
    flag, code, always_named = "instruction_subset", "IS", True
    help = "header lines to keep, e.g. Words,Features"
    example = "Words,Features"

    @classmethod
    def parse(cls, text):
        flag = "--instruction_subset"
        names = entries(flag, text)
        for name in names:
            if name not in INSTRUCTION_KEYS + ("Story",):
                raise UserError(f"{flag}: unknown header line '{name}'{closest(name, INSTRUCTION_KEYS)}; "
                                f"choose from {', '.join(INSTRUCTION_KEYS)} (Story is always kept)")
        return tuple(k for k in INSTRUCTION_KEYS if k in names)

    def header_keys(self, keys):
        return tuple(k for k in keys if k in self.value)

    @classmethod
    def flag_text(cls, tokens):
        return ",".join(tokens)
