"""The data transforms of `tinystories.py pretokenize`, one module each; importing this package
fills TRANSFORMS. The import order below is the order they apply to every example, and the
order of their parts in a dataset name:

    filtering -> mix_match -> adversarial_training -> refusal -> instruction_subset -> template

so filtering sees the raw feature lists (mix_match_pairs, named last, only changes how mix_match
relabels). All randomness comes from the shard's `random.Random`,
consumed in a fixed order per kept example: one draw per adversarial entry, one per refusal
entry (+ a sentence pick when a refusal fires), then the template's header sentence pick and
line shuffle. Changing that order changes every dataset.
"""
from tinylab.data.transforms.base import TRANSFORMS, Transform, register  # noqa: F401

# the order of these imports is the order of TRANSFORMS: isort must leave it
# isort: off
from tinylab.data.transforms import filtering  # noqa: F401
from tinylab.data.transforms import mix_match  # noqa: F401
from tinylab.data.transforms import adversarial_training  # noqa: F401
from tinylab.data.transforms import refusal  # noqa: F401
from tinylab.data.transforms import instruction_subset  # noqa: F401
from tinylab.data.transforms import mix_match_pairs  # noqa: F401  (changes mix_match; named last)
# isort: on
