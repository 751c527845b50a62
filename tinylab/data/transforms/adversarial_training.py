"""--adversarial_training=features=Twist:0.5: append the label VALUE to the instruction's KEY
list with probability PROB (one draw per entry, in order), keeping the story: the prompt asks
for something the story does not have."""
from tinylab.data.transforms.base import Transform, register
from tinylab.data.transforms.grammar import injections_text, parse_injections


@register
class AdversarialTraining(Transform):
    flag, code, always_named = "adversarial_training", "AT", True
    help = "e.g. features=Twist:1.0 (add label, keep story)"
    example = "features=Twist:0.5,words=dog:1.0"

    @classmethod
    def parse(cls, text):
        return parse_injections(f"--{cls.flag}", text)

    def apply(self, example, rng):
        for inj in self.value:
            if rng.random() < inj.prob:
                example["instruction"][inj.key].append(inj.value)
        return example

    @classmethod
    def flag_text(cls, tokens):
        return injections_text(tokens)
