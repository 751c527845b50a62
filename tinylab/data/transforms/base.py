"""What a data transform is, and the registry that lists them.

A transform is one `tinystories.py pretokenize` flag: its text is parsed once (a one-line
UserError naming the flag on the first problem), applied to each example, and written into the
dataset's name and manifest. `TRANSFORMS` lists the transform classes in registration order,
which is the order they apply to an example and appear in a dataset name.
"""
import abc

from tinylab.core.registry import Registry

TRANSFORMS = Registry("data transform")

# how the original turned flag text into a dataset name, replacements in exactly this order
_NAME_REPLACEMENTS = (("None", "none"), ("!=", "_x_"), ("=", "_"), (",", "_"), (":", "_"))


def register(cls):
    """Class decorator: list a Transform in TRANSFORMS under its flag."""
    return TRANSFORMS.register(cls.flag, cls)


def name_text(text: str) -> str:
    for old, new in _NAME_REPLACEMENTS:
        text = text.replace(old, new)
    return text


class Transform(abc.ABC):
    flag = ""  # the option: --flag on the command line, the key in the manifest's options
    code = ""  # its tag in dataset names: <code>_<flag text, rewritten>
    help = ""  # the option's --help text
    example = ""  # a valid flag text (the registry's tests read every transform's)
    # the original's five flags are in every name and manifest, as 'none' / null when not given;
    # a newer transform only when given, so that adding one renames no existing dataset
    always_named = False
    drops = False  # may drop examples: named when a dataset would keep no story at all

    def __init__(self, text: str):
        self.text = text
        self.value = self.parse(text)

    @classmethod
    @abc.abstractmethod
    def parse(cls, text: str):
        """The validated value of the flag's text; a one-line UserError naming the flag otherwise."""

    def apply(self, example: dict, rng):
        """The example after this transform, or None to drop it. `example` is the working copy
        (its own dict and instruction lists: edit it in place). Every draw from `rng` shifts all
        later draws of the shard, so draw in a fixed order, and only when this flag is given."""
        return example

    def bind(self, transforms: tuple):
        """Called once with every given transform (this one included): a flag that changes how
        another one works (mix_match_pairs) sets it here."""

    def header_keys(self, keys: tuple) -> tuple:
        """The template's header lines to write, given those kept by the earlier transforms."""
        return keys

    @classmethod
    def name_part(cls, text) -> str:
        """This flag's part of a dataset name (text None: not given, '<code>_none')."""
        return name_text(f"{cls.code}_{text}")

    @classmethod
    @abc.abstractmethod
    def flag_text(cls, tokens: list) -> str:
        """The reverse of name_part: the flag text that names as `tokens` (the part after the code,
        split at '_'). A guess, kept only when it parses and names the same dataset again; an
        IndexError when the tokens cannot be read."""
