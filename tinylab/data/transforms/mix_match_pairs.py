"""--mix_match_pairs=original: --mix_match as the study's tinystories.py applied it. Its
make_mix_match_func (tinystories.py:229-242) built each entry's table with
`range(1, len(match[1:]) - 1, 2)`, which leaves the last FROM:TO pair out (a single pair, the
only one the study used, changed nothing), and applied the pairs one after another (A:B:B:A then
maps A to B and back to A). Only with --mix_match (tinystories.py checks), and named only when
given, so that every other dataset keeps its name."""
from tinylab.core.compat import declare_difference
from tinylab.core.config import Key
from tinylab.core.errors import UserError
from tinylab.data.transforms.base import Transform, register
from tinylab.data.transforms.mix_match import MixMatch

MIX_MATCH_PAIRS = Key("mix_match_pairs", "", "original: --mix_match as the study's tinystories.py did it: each "
                      "entry's last FROM:TO pair dropped, the others applied one after another (one pair changes "
                      "nothing); needs --mix_match", choices=("", "original"))
declare_difference(MIX_MATCH_PAIRS, original="original", family="study",
                   behaviour="make_mix_match_func reads an entry's pairs with range(1, len(match[1:]) - 1, 2), "
                   "leaving the last one out, and applies the rest in turn: features=Foreshadowing:Twist is a no-op",
                   source="RobertKirk/tinystories-wrappers tinystories.py:231")


def original_relabel(values: list, table: dict) -> list:
    """The original's swap_fn on one instruction list: every (FROM, TO) pair of the entry but the
    last, each in turn."""
    for src, dst in list(table.items())[:-1]:
        if src in values:
            values = [dst if v == src else v for v in values]
    return values


@register
class MixMatchPairs(Transform):
    flag, code = "mix_match_pairs", "MP"
    help = MIX_MATCH_PAIRS.help
    example = "original"

    @classmethod
    def parse(cls, text):
        if text != "original":
            raise UserError(f"--mix_match_pairs: '{text}' is not a choice: the one value is 'original' (leave the "
                            f"flag out to apply every pair)")
        return text

    def bind(self, transforms):
        for t in transforms:
            if isinstance(t, MixMatch):
                t.relabel = original_relabel

    @classmethod
    def flag_text(cls, tokens):
        return "_".join(tokens)
