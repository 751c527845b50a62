"""A procedural children's-story corpus in the TinyStories schema (the README demo's data).

Every story is built from this file's own grammar (no TinyStories text): a hero with a special
object goes somewhere with a friend, something happens, and the story ends. Each of the six
features is drawn independently and, when present, leaves its own trace in the story text:

    Dialogue       quoted speech ("..." said Mia.); stories without it contain no '"' at all
    Twist          a surprise turn: a setup, a surprise lead-in, and a reveal that overturns it
    BadEnding      the story ends badly (lost, broken, hurt, alone) instead of happily
    MoralValue     a stated lesson near the end ("Mia learned that ...")
    Foreshadowing  an early hint (dark clouds, a loose board, a watching goat, ...) that pays off
                   later with a sentence pointing back at it; without the feature, the same kind
                   of event may still happen, but unannounced
    Conflict       a disagreement or struggle (a tug-of-war, an argument, a bully, an obstacle)

Records carry words = [verb, noun, adjective] that literally occur in the story, the features,
a one-sentence summary, and source "tinystories-lab synth v1". Each shard depends only on
(seed, shard index), so shards can be made in any order and are reproducible.
"""
from dataclasses import dataclass, field

from tinylab.data.records import FEATURES, STREAM_SYNTH, shard_rng

SOURCE = "tinystories-lab synth v1"
# independent per-story probabilities: each filtered / specialised dataset keeps a real share
FEATURE_PROBS = {"Dialogue": 0.4, "Twist": 0.3, "BadEnding": 0.2, "MoralValue": 0.3,
                 "Foreshadowing": 0.25, "Conflict": 0.35}
assert set(FEATURE_PROBS) == set(FEATURES)

# ----------------------------------------------------------------------------------------------
# vocabulary

GIRLS = ["Lily", "Mia", "Zoe", "Anna", "Ella", "Ruby", "Rosa", "Nina", "Ivy", "Luna", "Sara", "Maya",
         "Jade", "Pia", "Tara", "Emma", "Lucy", "Daisy", "Hana", "Amara", "Chloe", "Greta", "Nora", "Isla"]
BOYS = ["Tom", "Ben", "Sam", "Max", "Leo", "Finn", "Jack", "Omar", "Theo", "Kai", "Milo", "Eli",
        "Noah", "Owen", "Hugo", "Arjun", "Felix", "Oscar", "Ravi", "Jonah", "Luca", "Mateo", "Yusuf", "Ollie"]
ANIMALS = ["bunny", "puppy", "kitten", "bear", "fox", "duck", "mouse", "squirrel", "owl", "turtle",
           "frog", "lamb", "pig", "hedgehog", "goat", "penguin"]
PET_NAMES = ["Pip", "Coco", "Biscuit", "Nibbles", "Patch", "Bubbles", "Pebble", "Whiskers", "Hoppy",
             "Sunny", "Fluff", "Button", "Ziggy", "Toffee", "Muffin", "Peanut"]
ADULTS = [("Mom", "she"), ("Dad", "he"), ("Grandma", "she"), ("Grandpa", "he"), ("Aunt Rose", "she"),
          ("Uncle Joe", "he"), ("Miss Kim", "she"), ("Mr. Green", "he")]
NEIGHBORS = [("Mr. Bramble", "he"), ("Mrs. Thistle", "she"), ("Old Man Crow", "he"), ("Mrs. Pickett", "she")]
BULLIES = ["Rex", "Brutus", "Spike", "Bruno", "Gus", "Marge"]
BULLY_KINDS = ["boy", "girl", "dog", "goose", "crab", "raccoon"]
BEASTS = ["goat", "puppy", "crow", "monkey", "raccoon", "seagull"]
SMALL_THINGS = ["coin", "marble", "button", "pebble"]
TRAITS = ["happy", "curious", "kind", "brave", "shy", "playful", "clever", "cheerful", "gentle",
          "busy", "sleepy", "silly", "proud", "little", "friendly"]
TIMES = ["morning", "afternoon", "sunny day", "windy day", "cold winter day", "warm summer evening",
         "spring day", "Saturday morning", "quiet Sunday"]

NOUNS = ["ball", "kite", "box", "hat", "boat", "drum", "flower", "cookie", "key", "balloon", "book",
         "shell", "crayon", "blanket", "map", "bell", "lamp", "rock", "feather", "cup", "car", "doll",
         "robot", "train", "bucket", "scarf", "sock", "ring", "apple", "toy", "wagon", "umbrella", "jar",
         "basket", "pencil", "stick", "leaf", "shoe", "puzzle", "spoon", "whistle", "mirror", "ribbon",
         "candle", "pillow", "rope", "teapot", "crown", "banana", "star"]
ADJECTIVES = ["shiny", "red", "blue", "yellow", "green", "big", "little", "tiny", "soft", "old", "new",
              "funny", "bright", "fluffy", "colorful", "sparkly", "round", "smooth", "heavy", "pretty",
              "strange", "special", "golden", "striped", "purple", "warm", "wooden", "silver", "orange",
              "gentle", "bumpy", "lovely", "fancy", "plain"]
# (verb, phrases that use it in its base form)
VERBS = [
    ("play", ["play with the {noun}", "play a game with the {noun}"]),
    ("build", ["build a tall tower", "build a little house for the {noun}"]),
    ("paint", ["paint a picture of the {noun}", "paint the {noun} bright colors"]),
    ("dig", ["dig a big hole", "dig for treasure"]),
    ("bake", ["bake cookies for everyone", "bake a cake"]),
    ("climb", ["climb the tallest tree", "climb to the top of the hill"]),
    ("find", ["find a hidden treasure", "find the biggest puddle"]),
    ("share", ["share the {noun} with a friend", "share a snack"]),
    ("hide", ["hide the {noun} in a secret spot", "hide behind the big tree"]),
    ("throw", ["throw the {noun} very high", "throw stones into the water"]),
    ("carry", ["carry the {noun} all the way home", "carry the {noun} to the top of the hill"]),
    ("fix", ["fix the {noun}", "fix the old fence"]),
    ("clean", ["clean the {noun}", "clean the whole yard"]),
    ("sing", ["sing a song about the {noun}", "sing loudly"]),
    ("dance", ["dance around the {noun}", "dance in the rain"]),
    ("draw", ["draw a picture of the {noun}", "draw a big sun"]),
    ("jump", ["jump over the puddles", "jump as high as the sky"]),
    ("explore", ["explore the {place}", "explore every corner of the {place}"]),
    ("catch", ["catch a butterfly", "catch the {noun}"]),
    ("show", ["show the {noun} to everyone", "show {friend} the {noun}"]),
    ("give", ["give the {noun} to {friend}", "give a present to {adult}"]),
    ("collect", ["collect shiny stones", "collect pretty leaves"]),
    ("plant", ["plant a flower", "plant a tree"]),
    ("wash", ["wash the {noun}", "wash the dog"]),
    ("read", ["read a book about the {noun}", "read a story"]),
    ("kick", ["kick the {noun} far away", "kick a ball"]),
    ("decorate", ["decorate the {noun}", "decorate the house"]),
    ("race", ["race to the big tree", "race {friend}"]),
    ("visit", ["visit {adult}", "visit the {place}"]),
    ("count", ["count the stars", "count the birds"]),
    ("wrap", ["wrap the {noun} as a gift", "wrap a present"]),
    ("swing", ["swing on the old rope", "swing higher and higher"]),
]
PLACES = {
    "park": ["The swings went up and down.", "Ducks were swimming in the pond.", "Children were laughing on the slide."],
    "garden": ["Bees buzzed around the flowers.", "The tomatoes were red and round.", "A little path wound between the roses."],
    "beach": ["The waves rolled in and out.", "The sand was warm under their feet.", "Seagulls flew over the water."],
    "forest": ["Tall trees stood all around them.", "Birds sang high in the branches.", "Leaves crunched under their feet."],
    "farm": ["The cows were eating grass.", "Chickens ran around the barn.", "A big red tractor stood by the fence."],
    "backyard": ["The grass was soft and green.", "An old swing hung from the apple tree.", "A cat slept on the fence."],
    "lake": ["The water sparkled in the sun.", "Frogs jumped from leaf to leaf.", "A little boat floated by."],
    "hill": ["From the top, they could see the whole town.", "The wind blew through the tall grass.", "Sheep were resting on the slope."],
    "playground": ["The slide was long and shiny.", "Kids were playing tag.", "The sandbox was full of toys."],
    "meadow": ["Butterflies danced over the flowers.", "The grass was high and yellow.", "A rabbit hopped away."],
    "kitchen": ["It smelled of fresh bread.", "Pots and pans hung on the wall.", "The window was open to the garden."],
    "library": ["The shelves were full of books.", "It was very quiet inside.", "A big clock ticked on the wall."],
    "zoo": ["The monkeys swung from the trees.", "A lion was sleeping in the sun.", "The elephants splashed in their pool."],
    "market": ["People were selling fruit and bread.", "There were colorful tents everywhere.", "A man was playing music."],
    "river": ["The water ran fast over the rocks.", "Fish jumped out of the water.", "Tall reeds grew on the bank."],
    "pond": ["Ducks were paddling around.", "Lily pads floated on the water.", "Dragonflies zipped over the surface."],
    "field": ["The corn was taller than a grown-up.", "A scarecrow stood in the middle.", "Crows cawed in the distance."],
    "schoolyard": ["The bell had just rung.", "Children ran in every direction.", "Chalk drawings covered the ground."],
}

# ----------------------------------------------------------------------------------------------
# story blocks. Templates are str.format()ed with the story context; Dialogue stories may use
# the speech variants, all other text is quote-free.

OPENINGS = [
    "Once upon a time, there was a {trait} {kind} named {name}.",
    "There once was a {trait} {kind} called {name}.",
    "{name} was a {trait} {kind} who lived near the {place}.",
    "In a small town, there lived {a_kind} named {name}.",
    "Once, in a quiet village, lived a {trait} {kind} called {name}.",
    "One {time}, a {trait} {kind} named {name} woke up with a big smile.",
    "Long ago, there was {a_kind} named {name} who loved the {place}.",
    "{name} the {kind} lived in a little house close to the {place}.",
    "Not far from the {place}, there lived a {trait} {kind} named {name}.",
    "Once upon a time, in a land full of flowers, there lived {a_kind} called {name}.",
]
OBJECT_INTROS = [
    "{He} had {a_adj} {noun} that {he} loved very much.",
    "{His} favorite thing in the world was {a_adj} {noun}.",
    "One day, {he} found {a_adj} {noun} under {his} bed.",
    "{adult} gave {him} {a_adj} {noun} as a present.",
    "On {his} way home, {he} saw {a_adj} {noun} lying in the grass.",
    "{name} kept {a_adj} {noun} in a box next to {his} bed.",
    "Every day, {name} took {his} {adj} {noun} everywhere {he} went.",
    "{name}'s greatest treasure was {a_adj} {noun}.",
]
GOALS = [
    "{name} wanted to {vphrase}.",
    "More than anything, {name} wanted to {vphrase}.",
    "That day, {he} had a big plan: {he} would {vphrase}.",
    "{He} dreamed of a chance to {vphrase}.",
    "{name} asked {adult} if {he} could {vphrase}, and {adult} said yes.",
    "Today, {name} decided to {vphrase}.",
]
GOAL_SPEECH = [
    [("name", "I want to {vphrase}!")],
    [("name", "Can I {vphrase} today?"), ("adult", "Yes, but be careful.")],
    [("name", "Let's {vphrase}!"), ("adult", "What a good idea.")],
    [("name", "Today I will {vphrase}.")],
]
TRIPS = [
    "So {name} and {friend} went to the {place} together.",
    "{He} ran to the {place}, where {his} friend {friend} was waiting.",
    "After breakfast, {name} took the {noun} and walked to the {place} with {friend}.",
    "{name} met {his} friend {friend}, {a_fkind}, at the {place}.",
    "{He} and {friend} skipped all the way to the {place}.",
    "Later, {name} went to the {place} with {his} best friend, {friend}.",
]
ACTIVITIES = [
    "They played happily for a while.",
    "At first, everything was fun.",
    "{name} and {friend} laughed and played.",
    "It was a perfect day to be outside.",
    "{name} felt happy and free.",
    "They looked around and smiled.",
]

# events: an early hint + a payoff pointing back at it (Foreshadowing), or a plain version that
# just happens (some stories without the feature)
EVENTS = [
    {"hint": ["Far away, dark clouds were gathering over the hills, but {name} did not notice them.",
              "{adult} looked at the dark clouds in the sky and said that a storm might come later.",
              "A few dark clouds sat at the edge of the sky, and the wind was slowly getting stronger.",
              "Little did {name} know, the dark clouds behind the hills would soon change everything."],
     "payoff": ["The dark clouds from before finally reached the {place}, and big drops of rain began to fall.",
                "Then the storm that had been waiting behind the hills arrived, and rain poured down.",
                "Soon the sky turned black, just as the clouds had promised, and the rain came down hard."],
     "plain": ["Then it started to rain.", "After a while, a little rain began to fall."],
     "summary": "gets caught in the rain"},
    {"hint": ["On the way, they crossed an old wooden bridge, and one of its boards wobbled.",
              "{adult} had said that the old bridge over the stream was not very strong.",
              "{name} noticed a loose board on the little bridge, but {he} did not think about it again."],
     "payoff": ["On the way back, the loose board on the bridge cracked, and the {noun} fell into the stream.",
                "When they crossed the old bridge again, the weak board broke with a snap, and the {noun} splashed into the water."],
     "plain": ["Then the {noun} slipped from {his} hands and fell into a puddle."],
     "summary": "drops the {noun} into the water"},
    {"hint": ["There was a small hole in {his} pocket, but {he} did not see it.",
              "{name} put {his} lucky {small} in {his} pocket, not knowing that the pocket had a tiny hole."],
     "payoff": ["When {he} reached into {his} pocket, the lucky {small} was gone. It had slipped out through the little hole.",
                "Later, {name} found out that the hole in {his} pocket had let {his} lucky {small} fall out."],
     "plain": [],
     "summary": "loses a lucky {small}"},
    {"hint": ["A hungry {beast} was watching the {noun} from behind a bush.",
              "{name} did not see the {beast} that was staring at the {noun} with big eyes.",
              "Nearby, a sneaky {beast} kept looking at the {noun}."],
     "payoff": ["Then the {beast} that had been watching jumped out, grabbed the {noun}, and ran away.",
                "As soon as {name} looked away, the sneaky {beast} from the bush snatched the {noun}."],
     "plain": ["Then a {beast} ran by and grabbed the {noun}."],
     "summary": "has the {noun} taken by a {beast}"},
    {"hint": ["The ground was still wet and slippery from the night before.",
              "{adult} told {him} to walk slowly, because the rocks near the water were slippery."],
     "payoff": ["Because the ground was so slippery, {name} slipped and fell down, just as {he} had been told.",
                "The slippery rocks were waiting, and soon {name} slid and landed on the ground."],
     "plain": ["Then {name} tripped over a root and fell down."],
     "summary": "slips and falls"},
    {"hint": ["Before {he} left, {adult} gave {him} a little silver key and told {him} to keep it safe, because one day it would be useful.",
              "{name} found a tiny key on the path and put it in {his} pocket, not knowing how important it would be."],
     "payoff": ["{name} remembered the little key. {He} tried it, and it fit the lock of the old gate perfectly!",
                "At the end of the path was a locked chest, and the key from before opened it with a click."],
     "plain": ["They found an old gate, and it was open."],
     "summary": "opens a locked gate"},
    {"hint": ["{name} was in such a hurry that {he} left {his} lunch box on the kitchen table.",
              "In the rush, {name} forgot to pack any food."],
     "payoff": ["By noon, {his} tummy was rumbling, and {he} wished {he} had not forgotten {his} lunch.",
                "Soon {name} was very hungry, and {he} remembered the lunch {he} had left at home."],
     "plain": ["After a while, they ate some apples under a tree."],
     "summary": "gets very hungry"},
    {"hint": ["One wheel of {his} old wagon was a little wobbly, but {name} put the {noun} in it anyway.",
              "{name} saw that one wheel of the wagon was loose, but {he} did not tell anyone."],
     "payoff": ["Then the loose wheel finally came off, and the wagon tipped over.",
                "Halfway down the hill, the wobbly wheel from before rolled away, and everything fell out."],
     "plain": ["On the way, {name} bumped into a big rock."],
     "summary": "has a wagon accident"},
    {"hint": ["The sun was getting hotter and hotter, and {name} was holding a big ice cream.",
              "{name} bought a cold ice cream, even though the day was very hot."],
     "payoff": ["Soon the hot sun melted the ice cream, and it dripped all over {his} hands.",
                "The heat had been growing all day, and now the ice cream was a sticky puddle."],
     "plain": ["They drank some cold water because it was hot."],
     "summary": "watches an ice cream melt"},
    {"hint": ["{adult} said they had to be home before dark, and the sun was already low.",
              "The sun was already sinking behind the trees when they started."],
     "payoff": ["Before long, it got dark, as the low sun had warned, and they had to hurry home.",
                "The sun that had been sinking was gone now, and the path was dark."],
     "plain": ["Soon it was time to go home."],
     "summary": "has to hurry home in the dark"},
]

# conflicts: narrated or spoken, and how they end in a good / bad story
CONFLICTS = [
    {"narr": ["{friend} wanted the {noun} too. {name} and {friend} both grabbed it and pulled as hard as they could.",
              "Then {friend} tried to take the {noun}, and the two friends began to fight over it."],
     "speech": [[("friend", "Give me the {noun}!"), ("name", "No, it is mine!")],
                [("friend", "It is my turn now!"), ("name", "No, I had it first!")]],
     "good": ["In the end, they said sorry and decided to take turns.",
              "After a while, they stopped pulling and agreed to share."],
     "bad": ["Neither of them would let go, and the {noun} tore in two."],
     "summary": "fights with {friend} over the {noun}"},
    {"narr": ["But {friend} did not want to {verb}. {Fhe} wanted to do something else, and they started to argue.",
              "{friend} thought it was a bad idea, and the two of them argued for a long time."],
     "speech": [[("friend", "I do not want to {verb}! That is boring."), ("name", "But it will be fun!")],
                [("friend", "That is a silly plan."), ("name", "It is not silly!")]],
     "good": ["Finally, they found a way to do both, one after the other.",
              "At last, they listened to each other and made a plan together."],
     "bad": ["They argued until {friend} walked away."],
     "summary": "argues with {friend}"},
    {"narr": ["But {adult} said no, and {name} stomped {his} feet and frowned.",
              "{adult} told {name} to stay inside, but {name} did not agree at all."],
     "speech": [[("adult", "Not now, {name}."), ("name", "But I really want to!")],
                [("adult", "You must wait."), ("name", "I do not want to wait!")]],
     "good": ["Later, {adult} explained why, and {name} understood.",
              "After a hug, {name} and {adult} found a good time to go together."],
     "bad": ["{name} sneaked away anyway."],
     "summary": "disagrees with {adult}"},
    {"narr": ["Then a big {bkind} named {bully} came and took the {noun} away. {name} was angry and told {bully} to give it back.",
              "A mean {bkind} called {bully} pushed {name} and grabbed the {noun}."],
     "speech": [[("bully", "This is mine now!"), ("name", "Give it back!")],
                [("bully", "Ha, you cannot catch me!"), ("name", "That is not fair!")]],
     "good": ["{bully} saw how sad {name} was, said sorry, and gave the {noun} back.",
              "{friend} stood next to {name}, and {bully} gave the {noun} back."],
     "bad": ["{bully} ran off with the {noun} and laughed."],
     "summary": "stands up to {bully}"},
    {"narr": ["The {noun} got stuck high up in a tree. {name} jumped and stretched, but {he} could not reach it.",
              "A heavy rock blocked the path. {name} pushed and pushed, but it would not move."],
     "speech": [[("name", "I cannot do it!"), ("friend", "Keep trying!")],
                [("name", "It is too hard!"), ("friend", "Do not give up!")]],
     "good": ["Then {friend} helped, and together they did it.",
              "With one more big try and some help from {friend}, it worked."],
     "bad": ["No matter how hard {he} tried, it was no use."],
     "summary": "struggles with a hard problem"},
]

# twists: a setup (expectation), a surprise lead-in, and a reveal that overturns it
TWIST_LEADS = ["But then something surprising happened.", "Then came a big surprise.",
               "Nobody expected what happened next.", "But the story took a strange turn.",
               "Then everything changed in a way nobody saw coming.", "But guess what?",
               "And then, something unexpected happened.", "But that was not the end of it."]
TWIST_PREFIXES = ["", "To everyone's surprise, ", "It turned out that ", "Surprisingly, ",
                  "To {his} great surprise, "]
TWISTS = [
    {"setup": ["{name} heard a loud noise behind the bushes. {He} was scared that it was a monster.",
               "Something big was moving in the shadows, and {name} held {his} breath."],
     "reveal": ["the scary monster was only {twister}, who wanted to play.",
                "it was not a monster at all. It was {twister}, hiding and giggling."],
     "summary": "finds out the scary noise was {twister}"},
    {"setup": ["{name} held the {noun} tight.", "{name} looked at the {noun} for a long time."],
     "reveal": ["the {noun} began to glow and float in the air. It was a magic {noun}!",
                "the {noun} started to talk in a tiny voice.",
                "the {noun} could grant wishes."],
     "summary": "discovers that the {noun} is magic"},
    {"setup": ["Then {name} could not find the {noun}. {He} looked under the bed, behind the door and in the garden, but it was gone."],
     "reveal": ["{friend} had been keeping the {noun} safe the whole time.",
                "the {noun} had been inside {his} own backpack all along."],
     "summary": "finds the lost {noun} in an unexpected place"},
    {"setup": ["Everyone said that {neighbor} was grumpy and mean, so {name} was afraid of {nhim}."],
     "reveal": ["{neighbor} was the kindest person in town. {Nhe} had been fixing the {noun} as a gift for {name}.",
                "{neighbor} was not mean at all; {nhe} had secretly been feeding the birds every morning."],
     "summary": "learns that {neighbor} is kind"},
    {"setup": ["{name} thought that everyone had forgotten {his} birthday. Nobody said anything all day."],
     "reveal": ["when {he} opened the door, all {his} friends were waiting with a big cake. They had planned a party!"],
     "summary": "gets a surprise party"},
    {"setup": ["{adult} gave {name} a big box and told {him} not to open it until the evening.",
               "{name} found a heavy box by the door."],
     "reveal": ["the box was not full of toys. Inside were three sleepy puppies!",
                "the box was empty, but under it lay a map to a hidden treasure."],
     "summary": "opens a box with a surprise inside"},
    {"setup": ["An old woman asked {name} for help with her bags, and {name} helped her."],
     "reveal": ["the old woman was really a fairy, and she gave {name} a wish.",
                "the old woman was the queen of the whole land!"],
     "summary": "helps an old woman who is not what she seems"},
    {"setup": ["{name} planted one tiny seed next to the {place}."],
     "reveal": ["the next morning the tiny seed had grown into a giant plant that reached the clouds!"],
     "summary": "grows a giant plant from a tiny seed"},
    {"setup": ["A big dog chased {name} down the street, and {he} ran as fast as {he} could."],
     "reveal": ["the dog only wanted to bring back the {noun} that {name} had dropped."],
     "summary": "is chased by a dog that only wants to help"},
]
TWISTERS = ["a tiny kitten", "a lost puppy", "{adult}", "{friend}", "a friendly old bear", "a little hedgehog"]
TWIST_REACTIONS = [("name", "Wow, I did not expect that!"), ("friend", "What a surprise!"), ("name", "I can't believe it!")]
# the same setups resolving as expected (no surprise): occasional filler in stories without Twist
NON_TWISTS = [
    "{name} heard a noise behind the bushes. {He} peeked and saw a little bird, just as {he} had guessed.",
    "{adult} gave {name} a box. Inside were the crayons {he} had asked for.",
    "{name} planted a seed, and after many days a small green sprout came up.",
    "{name} looked for the {noun} and found it on {his} bed, where {he} had left it.",
]

GOOD_ENDINGS = ["In the end, everyone was happy.", "{name} smiled all the way home.", "It was the best day ever.",
                "They played together until the sun went down.", "{name} hugged {friend} and said thank you.",
                "That night, {name} fell asleep with a big smile.", "{name} and {friend} became best friends."]
GOOD_SPEECH = [("name", "This was the best day ever!"), ("friend", "Let's play again tomorrow!")]
BAD_ENDINGS = ["In the end, the {noun} was broken, and nobody could fix it.", "{name} never saw the {noun} again.",
               "The {noun} was lost forever.", "{name} fell and hurt {his} knee, and the day was ruined.",
               "{friend} went home angry, and they never played together again.",
               "{name} had to walk home wet, cold and alone.", "Everything was spoiled, and {name} could not stop crying."]
BAD_CLOSERS = ["{He} felt very sad.", "It was a very bad day.", "{name} went to bed with tears in {his} eyes.",
               "And that was the sad end of the {adj} {noun}.", "Nothing was ever the same again."]
BAD_SPEECH = [("name", "This is the worst day ever!"), ("name", "Why did this happen to me?")]

LESSONS_BY_CONTEXT = {
    "conflict": ["sharing is better than fighting", "it is good to take turns", "friends should listen to each other",
                 "saying sorry can fix a lot"],
    "event": ["it is wise to listen when someone warns you", "being careful keeps you safe",
              "it is smart to be ready for anything"],
    "bad": ["you should be careful with the things you love", "being greedy never helps"],
    "any": ["being kind always matters", "telling the truth is important", "it is good to help others",
            "you should never give up", "good things come to those who wait", "being brave means trying even when you are scared"],
}
MORALS = ["{name} learned that {lesson}.", "The lesson of the story is that {lesson}.",
          "From that day on, {name} always remembered that {lesson}.", "That day, {name} understood that {lesson}.",
          "And so {name} found out that {lesson}."]
MORAL_SPEECH = ("adult", "Remember, {lesson}.")
SAY_VERBS = {"!": ["shouted", "cried", "said"], "?": ["asked"], ".": ["said", "replied", "whispered"]}


# ----------------------------------------------------------------------------------------------
# generation

def _a(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def _person(rng, exclude=()):
    """(name, kind, pronoun) of a child or a named animal."""
    while True:
        r = rng.random()
        if r < 0.35:
            who = (rng.choice(GIRLS), "girl", "she")
        elif r < 0.7:
            who = (rng.choice(BOYS), "boy", "he")
        else:
            who = (rng.choice(PET_NAMES), rng.choice(ANIMALS), rng.choice(["he", "she"]))
        if who[0] not in exclude:
            return who


PRONOUNS = {"he": ("he", "him", "his"), "she": ("she", "her", "her")}


class _Story:
    """One story's context and the helpers that render its sentences."""

    def __init__(self, rng):
        self.rng = rng
        name, kind, pron = _person(rng)
        friend, fkind, fpron = _person(rng, exclude=(name,))
        adult, apron = rng.choice(ADULTS)
        neighbor, npron = rng.choice(NEIGHBORS)
        self.verb, phrases = rng.choice(VERBS)
        he, him, his = PRONOUNS[pron]
        self.ctx = dict(
            name=name, kind=kind, a_kind=_a(kind), he=he, him=him, his=his, He=he.title(), His=his.title(),
            friend=friend, a_fkind=_a(fkind), Fhe=PRONOUNS[fpron][0].title(),
            adult=adult, neighbor=neighbor, nhim=PRONOUNS[npron][1], Nhe=npron.title(), nhe=npron,
            noun=rng.choice(NOUNS), place=rng.choice(list(PLACES)), trait=rng.choice(TRAITS),
            time=rng.choice(TIMES), bully=rng.choice(BULLIES), bkind=rng.choice(BULLY_KINDS),
            beast=rng.choice(BEASTS), small=rng.choice(SMALL_THINGS), verb=self.verb)
        adj = rng.choice(ADJECTIVES)
        self.ctx.update(adj=adj, a_adj=_a(adj))
        self.ctx["vphrase"] = self.fill(rng.choice(phrases))
        self.ctx["twister"] = self.fill(rng.choice(TWISTERS))
        self.speakers = {"name": name, "friend": friend, "adult": adult, "bully": self.ctx["bully"]}

    def fill(self, template):
        return template.format(**self.ctx)

    def pick(self, templates):
        return self.fill(self.rng.choice(templates))

    def say(self, speaker, line):
        """One line of quoted speech with a varied speech tag."""
        who, line = self.speakers[speaker], self.fill(line)
        verb = self.rng.choice(SAY_VERBS[line[-1]])
        form = self.rng.randrange(3)
        if form == 0:
            return f'{who} {verb}, "{line}"'
        if form == 1 and line[-1] == ".":
            return f'"{line[:-1]}," {verb} {who}.'
        return f'"{line}" {verb} {who}.'

    def speech(self, lines):
        return " ".join(self.say(s, l) for s, l in lines)


def _clauses(parts):
    return ", ".join(parts[:-1] + ["and " + parts[-1]])


@dataclass
class _Plot:
    """What one story will contain: its features, and the plot elements that carry them."""
    has: dict  # feature -> present
    event: dict = None  # an EVENTS entry: foreshadowed (Foreshadowing) or plain
    conflict: dict = None
    twist: dict = None
    summary: list = field(default_factory=list)  # clauses, in story order

    @property
    def talk(self) -> bool:
        """May the story use quotes at all (Dialogue)."""
        return self.has["Dialogue"]


def _plot(rng, has) -> _Plot:
    """The plot elements the features need; a story without Foreshadowing may still have a plain
    event."""
    event = rng.choice(EVENTS) if has["Foreshadowing"] or rng.random() < 0.3 else None
    if event and not has["Foreshadowing"] and not event["plain"]:
        event = None
    conflict = rng.choice(CONFLICTS) if has["Conflict"] else None
    twist = rng.choice(TWISTS) if has["Twist"] else None
    return _Plot(has, event, conflict, twist)


def _setup(s, plot) -> list:
    """Paragraph 1: who, what they own, (a hint), what they want."""
    p1 = [s.pick(OPENINGS), s.pick(OBJECT_INTROS)]
    if plot.has["Foreshadowing"]:
        p1.append(s.pick(plot.event["hint"]))
    p1.append(s.speech(s.rng.choice(GOAL_SPEECH)) if plot.talk else s.pick(GOALS))
    return p1


def _outing(s, plot) -> list:
    """Paragraph 2: the outing, what happens (the event's payoff, the conflict)."""
    rng, event, conflict = s.rng, plot.event, plot.conflict
    p2 = [s.pick(TRIPS)]
    p2 += [s.fill(d) for d in rng.sample(PLACES[s.ctx["place"]], rng.randint(1, 2))]
    p2.append(s.pick(ACTIVITIES))
    if event:
        p2.append(s.pick(event["payoff"] if plot.has["Foreshadowing"] else event["plain"]))
        plot.summary.append(s.fill(event["summary"]))
    if conflict:
        use_speech = plot.talk and rng.random() < 0.8
        p2.append(s.speech(rng.choice(conflict["speech"])) if use_speech else s.pick(conflict["narr"]))
        if use_speech and rng.random() < 0.5:
            p2.append(s.pick(conflict["narr"]))
        if not plot.has["BadEnding"]:
            p2.append(s.pick(conflict["good"]))
        plot.summary.append(s.fill(conflict["summary"]))
    return p2


def _turn(s, plot) -> list:
    """The start of paragraph 3: the twist (setup, lead-in, reveal), or now and then a setup that
    resolves as expected."""
    rng, twist = s.rng, plot.twist
    if not twist:
        return [s.pick(NON_TWISTS)] if rng.random() < 0.25 else []
    p3 = [s.pick(twist["setup"])]
    lead = rng.random()
    prefix = s.fill(rng.choice(TWIST_PREFIXES[1:] if lead < 0.3 else TWIST_PREFIXES))
    reveal = s.pick(twist["reveal"])
    reveal = prefix + reveal if prefix else reveal[0].upper() + reveal[1:]
    p3 += [reveal] if lead < 0.3 else [rng.choice(TWIST_LEADS), reveal]
    if plot.talk and rng.random() < 0.6:
        p3.append(s.say(*rng.choice(TWIST_REACTIONS)))
    plot.summary.append(s.fill(twist["summary"]))
    return p3


def _ending(s, plot) -> list:
    rng = s.rng
    if plot.has["BadEnding"]:
        end = [s.pick(plot.conflict["bad"])] if plot.conflict else []
        end.append(s.pick(BAD_ENDINGS))
        end.append(s.say(*rng.choice(BAD_SPEECH)) if plot.talk and rng.random() < 0.5 else s.pick(BAD_CLOSERS))
        plot.summary.append("the day ends badly")
        return end
    end = [s.pick(GOOD_ENDINGS)]
    if plot.talk and rng.random() < 0.5:
        end.append(s.say(*rng.choice(GOOD_SPEECH)))
    plot.summary.append("everything ends well")
    return end


def _moral(s, plot) -> list:
    """The stated lesson (MoralValue), fitting what happened."""
    if not plot.has["MoralValue"]:
        return []
    rng = s.rng
    context = ("conflict" if plot.conflict else "event" if plot.event else "bad" if plot.has["BadEnding"] else "any")
    s.ctx["lesson"] = rng.choice(LESSONS_BY_CONTEXT[context] + LESSONS_BY_CONTEXT["any"])
    moral = s.say(MORAL_SPEECH[0], MORAL_SPEECH[1]) if plot.talk and rng.random() < 0.4 else s.pick(MORALS)
    plot.summary.append(f"{s.ctx['name']} learns that {s.ctx['lesson']}")
    return [moral]


def _record(s, plot, paragraphs) -> dict:
    """The record: story text, the prompt with its words and features, the summary."""
    rng = s.rng
    story = "\n\n".join(" ".join(p) for p in paragraphs if p)
    # the raw data often has stray leading/trailing newlines; keep some so consumers strip
    r = rng.random()
    story = "\n" + story if r < 0.05 else story + "\n" if r < 0.15 else story
    start = rng.choice(["{name} wants to {vphrase}", "A {kind} named {name} goes to the {place} to {vphrase}",
                        "{name} and {friend} spend a day at the {place}", "{name} sets out to {vphrase}"])
    features = [f for f in FEATURES if plot.has[f]]
    words = [s.verb, s.ctx["noun"], s.ctx["adj"]]
    prompt = (f'Write a simple story for young children that uses the verb "{words[0]}", the noun '
              f'"{words[1]}" and the adjective "{words[2]}".')
    if features:
        prompt += " The story should have these features: " + ", ".join(features) + "."
    return {
        "story": story,
        "instruction": {"prompt:": prompt, "words": words, "features": features},
        "summary": s.fill(start) + ", " + _clauses(plot.summary) + ".",
        "source": SOURCE,
    }


def generate_story(rng) -> dict:
    """One record in the TinyStories schema. The phases draw from `rng` in this fixed order
    (features, the story's cast and objects, plot elements, the paragraphs in reading order):
    any change to it changes every synthesized corpus."""
    has = {f: rng.random() < p for f, p in FEATURE_PROBS.items()}
    s = _Story(rng)
    plot = _plot(rng, has)
    p1 = _setup(s, plot)
    p2 = _outing(s, plot)
    p3 = _turn(s, plot) + _ending(s, plot) + _moral(s, plot)
    return _record(s, plot, (p1, p2, p3))


def generate_shard(seed: int, shard_index: int, num_stories: int) -> list:
    rng = shard_rng(seed, shard_index, STREAM_SYNTH)
    return [generate_story(rng) for _ in range(num_stories)]
