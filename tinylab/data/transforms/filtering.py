"""--filtering=features=Twist,features!=Dialogue,words=dog,length=300: keep an example if ALL
conditions hold. KEY=VALUE keeps it when true, KEY!=VALUE when false; features and words test
membership in the raw lists, length the raw (unstripped) story's characters, greater than."""
import re
from dataclasses import dataclass

from tinylab.core.errors import UserError
from tinylab.data.transforms.base import Transform, register
from tinylab.data.transforms.grammar import check_key, check_value, entries

FILTER_KEYS = ("features", "words", "length")


@dataclass(frozen=True)
class Condition:
    key: str  # features | words | length
    value: object  # str, or int for length
    keep_if_true: bool  # KEY=VALUE keeps when true, KEY!=VALUE keeps when false

    def holds(self, example) -> bool:
        if self.key == "length":
            return len(example["story"]) > self.value
        return self.value in example["instruction"][self.key]


@register
class Filtering(Transform):
    flag, code, always_named, drops = "filtering", "F", True, True
    help = "e.g. features!=Twist,features=Foreshadowing,words=dog,length=300"
    example = "features!=Twist,features=Foreshadowing,words=dog,length=300"

    @classmethod
    def parse(cls, text):
        flag, conditions = "--filtering", []
        for entry in entries(flag, text):
            if "!=" in entry:
                key, value = entry.split("!=", 1)
                keep = False
            elif "=" in entry:
                key, value = entry.split("=", 1)
                keep = True
            else:
                raise UserError(f"{flag}: '{entry}' is not KEY=VALUE or KEY!=VALUE "
                                f"(e.g. features!=Twist, words=dog, length=300)")
            check_key(flag, entry, key, FILTER_KEYS)
            if key == "length":
                if not re.fullmatch(r"\d+", value):
                    raise UserError(f"{flag}: '{entry}': length needs a whole number of characters, got '{value}'")
                value = int(value)
            else:
                check_value(flag, entry, key, value)
            conditions.append(Condition(key, value, keep))
        return tuple(conditions)

    def apply(self, example, rng):
        # first of the transforms, so it sees the raw feature lists
        return example if all(c.holds(example) == c.keep_if_true for c in self.value) else None

    @classmethod
    def flag_text(cls, tokens):
        tokens, conditions = list(tokens), []
        while tokens:
            key = tokens.pop(0)
            negated = len(tokens) > 1 and tokens[0] == "x"  # 'x' from '!='; misreads fail the round trip
            if negated:
                tokens.pop(0)
            conditions.append(f"{key}{'!=' if negated else '='}{tokens.pop(0)}")
        return ",".join(conditions)
