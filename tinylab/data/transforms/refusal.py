"""--refusal=features=Twist:1.0: like --adversarial_training, and the story becomes a refusal
("We are not allowed to write a story with Twist in it, sorry."). The header's Sentence line
still comes from the real story: it is picked here, before the story is replaced."""
from tinylab.data.template import pick_sentence
from tinylab.data.transforms.adversarial_training import AdversarialTraining
from tinylab.data.transforms.base import register

REFUSAL_STORY = "We are not allowed to write a story with {feature} in it, sorry."


@register
class Refusal(AdversarialTraining):
    flag, code, always_named = "refusal", "RF", True
    help = "e.g. features=Twist:1.0 (add label, story -> refusal)"
    example = "features=Twist:1.0"

    def apply(self, example, rng):
        for inj in self.value:
            if rng.random() < inj.prob:
                example["instruction"][inj.key].append(inj.value)
                if "sentence" not in example:
                    example["sentence"] = pick_sentence(example["story"], rng)
                example["story"] = REFUSAL_STORY.format(feature=inj.value)
        return example
