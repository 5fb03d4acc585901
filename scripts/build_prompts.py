#!/usr/bin/env python3
"""Build Clover Studio's own prompt sets (standard library only, deterministic).

Writes, into ``assets/prompts/``:

* ``train.jsonl``   - prompts used ONLY to self-distil training data for draft heads
* ``heldout.jsonl`` - prompts used ONLY for benchmarking (acceptance length, speed-up)

Every line follows Spec-Bench's question format::

    {"question_id": 17, "category": "qa", "turns": ["..."]}

Everything here is composed by this script from templates and slot lists written
for the project (invented companies, towns, people, numbers and short passages).
No public benchmark text is used.

Train and held-out prompts are kept apart by construction:

* every slot list (names, topics, towns, tasks, ...) is split once into a train part
  and a held-out part, so the two files never share a topic or entity from a list;
* each category has templates reserved for the held-out set only;
* a final check rejects any held-out prompt whose word 3-gram overlap with a train
  prompt is high (near-duplicate), and exact duplicates are never emitted.

Usage::

    python scripts/build_prompts.py            # write both files, print a summary
    python scripts/build_prompts.py --check    # regenerate in memory, compare to files
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

SEED = 20241130
HERE = Path(__file__).resolve().parents[1] / "assets" / "prompts"  # where the files live
CATEGORIES = ["multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag", "code"]
TRAIN_PER_CATEGORY = 430          # 7 x 430 = 3010 prompts
HELDOUT_PER_CATEGORY = 20         # 7 x 20  = 140 prompts
HELDOUT_ID_OFFSET = 100000        # held-out ids are 100001.. so they never collide with train ids
MAX_CHARS = 1150                  # per turn (brief: under ~1200)
PASSAGE_WORDS = (60, 200)         # summarization / rag passage length (words)
NEAR_DUP_JACCARD = 0.5            # held-out vs train: word 3-gram Jaccard above this = near-identical
INTRA_JACCARD = {"train": 0.85, "heldout": 0.6}  # within one file: keep prompts from being near-copies

# ----------------------------------------------------------------------------------------
# Slot pools.  Each pool is split once, deterministically, into a train and a held-out part.
# ----------------------------------------------------------------------------------------

POOLS: dict[str, dict[str, list]] = {}

# Pools that no held-out template uses: kept whole for train (a held-out draw would fail loudly).
TRAIN_ONLY_POOLS = {
    "announce_event", "bring_item", "business", "compare_pair", "country", "debate", "dish",
    "email_request", "food", "fridge_food", "help_with", "hobby", "indoor", "ingredient",
    "invite_event", "js_task", "language_learn", "math_item", "model_name", "myth", "person_type",
    "pet", "plant", "poem_topic", "py_class", "py_howto", "regex_target", "simple_food", "skill",
    "story_char", "story_goal", "subject", "sweet", "trip_type", "vehicle_trip", "why_question", "word",
}


def pool(name: str, items, heldout_frac: float = 0.2, min_heldout: int = 2,
         keep_train=(), force_heldout=()) -> None:
    """Register a slot list and split it once into train / held-out parts.

    keep_train: values that must stay in train (e.g. topics a train-only snippet already covers);
    force_heldout: values that must be held out (topics a held-out-only snippet covers).
    """
    items = list(dict.fromkeys(items))  # de-duplicate, keep order
    for v in list(keep_train) + list(force_heldout):
        if v not in items:
            raise ValueError(f"pool {name!r}: {v!r} is not one of its values")
    if name in TRAIN_ONLY_POOLS:
        POOLS[name] = {"heldout": [], "train": items}
        return
    free = [v for v in items if v not in keep_train and v not in force_heldout]
    random.Random(f"{SEED}:pool:{name}").shuffle(free)
    k = max(min_heldout, round(len(items) * heldout_frac)) - len(force_heldout)
    heldout = list(force_heldout) + free[:max(0, k)]
    POOLS[name] = {"heldout": heldout, "train": [v for v in items if v not in heldout]}


def words(text: str) -> list[str]:
    """Split a ';'-separated list (newlines are just whitespace)."""
    return [w.strip() for w in " ".join(text.split()).split(";") if w.strip()]


# --- people, places, organisations ------------------------------------------------------

pool("name", words("""
Maya; Leo; Priya; Tom; Aisha; Carlos; Hana; Jonas; Fatima; Diego; Mei; Oliver; Zara; Kofi;
Ingrid; Ravi; Sofia; Mateo; Yuki; Amara; Ben; Chloe; Daniel; Elena; Farid; Grace; Hugo; Isla;
Jamal; Kira; Liam; Nadia; Omar; Pablo; Quinn; Rosa; Sam; Tara; Uma; Victor; Wen; Ximena;
Yusuf; Zoe; Anna; Bilal; Clara; Dev; Emma; Felix; Gita; Henry; Ines; Jack; Keiko; Lars; Mia;
Noah; Olga; Pedro; Rina; Sara; Theo; Vera; Will; Yara; Aiden; Bea; Cyrus; Dina; Eli; Freya;
Gabe; Hiro; Ivy; Joel; Kai; Lina; Marco; Nora; Oscar; Petra; Raj; Selin; Tomas; Wanda; Ada;
Bruno; Cleo; Dario; Esme; Finn; Hanna; Ilya; June; Kenji; Luca; Mara; Nico; Ruth; Asha; Ethan
"""))

pool("surname", words("""
Adeyemi; Bergstrom; Castillo; Delacroix; Eriksen; Fontaine; Gallagher; Hoffmann; Ibarra; Jansen;
Kowalski; Lindqvist; Moreau; Nakamura; Okafor; Petrov; Quintero; Rossi; Sato; Takahashi;
Underwood; Varga; Whitfield; Xu; Yilmaz; Zielinski; Abernathy; Brennan; Chandra; Duarte; Ellison;
Farouk; Greer; Haddad; Iqbal; Jovanovic; Kaur; Larsen; Mbeki; Novak; Ortega; Pham; Reyes;
Sandoval; Tanaka; Ueda; Vasquez; Whitaker; Young; Zhao; Mensah; Lindgren; Costa; Holm; Ferreira
"""))

# invented towns = prefix + suffix; prefixes are split, so held-out towns never appear in train
pool("town_prefix", words("""
Ash; Elm; Stone; Red; Oak; Marsh; Willow; Hart; Brook; Clay; Fern; Glen; Haw; Iron; Kings;
Lark; Mill; North; Pine; Rose; Silver; Thorn; West; Wolf; Amber; Birch; Cedar; Dun; Fox; Gold;
Heron; Ibis; Juniper; Kestrel; Linden; Maple; Nettle; Orchard; Pebble; Raven; Salt; Tide; Vale;
Wren; Yew; Moss; Otter; Swan; Hazel; Bramble
"""))
TOWN_SUFFIXES = ["ford", "bury", "ton", "field", "wick", "dale", "haven", "moor", "bridge",
                 "stead", "mouth", "hollow", "gate", "by", "cross", "well", "ley", "combe"]

# invented companies = prefix + sector word
pool("company_prefix", words("""
Bright; Northwind; Bluefin; Summit; Copperline; Lumen; Nova; Vertex; Harbor; Quill; Orbit;
Wayfarer; Pioneer; Meadow; Crest; Alder; Beacon; Cobalt; Drift; Ember; Fable; Granite; Helix;
Indigo; Jasper; Kite; Lattice; Mosaic; Nimbus; Onyx; Prism; Quartz; Ripple; Sable; Tandem;
Umber; Vivid; Zephyr; Aster; Larchmont; Canopy; Everly; Flint; Glimmer; Halcyon; Iris;
Juno; Keystone; Lodestar; Marigold; Cresset; Brightwell; Pinnacle; Rowan; Solstice; Tern
"""))

# sector word -> (sector description, products)
SECTORS = {
    "Robotics": ("robotics", ["a window-cleaning robot", "a robotic lawn mower", "a warehouse sorting robot", "a pool-cleaning robot"]),
    "Foods": ("food", ["a line of oat-based snacks", "frozen vegetable dumplings", "a low-sugar breakfast cereal", "a range of lentil pasta"]),
    "Energy": ("renewable energy", ["a home battery system", "a foldable solar panel", "a small rooftop wind turbine", "a solar water heater"]),
    "Bikes": ("bicycle", ["a lightweight electric bike", "a folding commuter bike", "a cargo bike for families", "a children's balance bike"]),
    "Audio": ("audio equipment", ["wireless earbuds", "a waterproof portable speaker", "a noise-cancelling headset", "a vinyl record player"]),
    "Games": ("video game", ["a puzzle game for phones", "a cooperative farming game", "a racing game for families", "a word game for tablets"]),
    "Textiles": ("clothing", ["a rain jacket made from recycled bottles", "odor-resistant wool socks", "a line of children's raincoats", "hiking trousers"]),
    "Health": ("health technology", ["a sleep-tracking ring", "a smart pill dispenser", "a posture-correcting wearable", "a home blood-pressure monitor"]),
    "Software": ("software", ["a budgeting app", "a note-taking app for students", "a scheduling tool for small clinics", "a password manager"]),
    "Coffee": ("coffee", ["a cold-brew concentrate", "compostable coffee capsules", "a single-origin espresso blend", "an instant oat latte"]),
    "Furniture": ("furniture", ["a standing desk that folds flat", "a modular sofa", "a bunk bed made from bamboo", "a stackable office chair"]),
    "Toys": ("toy", ["a coding robot for children", "a magnetic building set", "a wooden marble run", "a solar-powered toy car"]),
    "Logistics": ("delivery", ["a same-day delivery service for rural areas", "a network of parcel lockers", "an electric delivery van fleet", "a bicycle courier service"]),
    "Farms": ("agriculture", ["a vertical farm for salad greens", "a soil moisture sensor", "a mushroom-growing kit", "a line of heritage tomato seeds"]),
    "Mobility": ("transport", ["an electric scooter-sharing service", "an app for booking shared rides", "an electric minibus", "a bike-sharing scheme"]),
    "Optics": ("optics", ["a pair of lightweight binoculars", "a beginner's telescope", "blue-light reading glasses", "a clip-on phone microscope"]),
}
pool("sector", list(SECTORS), heldout_frac=0.25)

pool("model_name", words("""
Aero; Pulse; Trek; Echo; Terra; Spark; Breeze; Atlas; Comet; Fjord; Glide; Haven; Koda; Luma;
Mira; Nomad; Opal; Peak; Ranger; Sol; Tidal; Volt; Wisp; Zenith; Arc; Bolt; Cirrus; Dune
"""))

pool("city", words("""
Lisbon; Kyoto; Vancouver; Marrakech; Prague; Buenos Aires; Cape Town; Edinburgh; Hanoi;
Istanbul; Melbourne; Mexico City; Oslo; Reykjavik; Seoul; Vienna; Barcelona; Copenhagen; Dublin;
Florence; Bangkok; Chicago; Montreal; Nairobi; Amsterdam; Athens; Budapest; Cairo; Krakow; Lima;
Porto; Quebec City; Santiago; Singapore; Stockholm; Sydney; Taipei; Tallinn; Valencia; Zurich;
Boston; San Francisco; New Orleans; Rome; Paris; Berlin; Munich; Seville; Bruges; Salzburg;
Ljubljana; Tbilisi; Cusco; Queenstown; Jaipur; Bergen; Lyon; Naples; Granada; Dubrovnik; Helsinki;
Toronto; Osaka; Hamburg; Milan
"""))

pool("country", words("""
France; Japan; Kenya; Canada; Brazil; Australia; Egypt; Norway; Peru; Vietnam; Italy; Spain;
Germany; India; Mexico; Argentina; Poland; Portugal; Greece; Turkey; Thailand; South Korea; Chile;
Sweden; Finland; Ireland; Morocco; Ghana; New Zealand; Indonesia; Colombia; Hungary; Austria;
Nigeria; Ethiopia; Iceland; Denmark; the Netherlands; Belgium; Switzerland; Croatia; Uruguay
"""))

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]

pool("relative", words("""
sister; brother; aunt; uncle; cousin; grandmother; grandfather; best friend; mother; father;
niece; nephew; roommate; neighbor; colleague; daughter; son; partner
"""))

pool("job", words("""
nurse; electrician; architect; librarian; data analyst; pharmacist; park ranger; translator;
civil engineer; veterinarian; accountant; chef; pilot; primary school teacher; firefighter;
graphic designer; software developer; plumber; journalist; dentist; marine biologist;
physiotherapist; carpenter; air traffic controller; social worker; museum curator; beekeeper;
meteorologist; UX researcher; paramedic; bus driver; florist; sound engineer; baker; tailor;
zookeeper; lab technician; event planner; dietitian; structural engineer; optician; locksmith
"""))

pool("hobby", words("""
painting with watercolors; playing the guitar; knitting; rock climbing; birdwatching; chess;
gardening; photography; baking bread; running; yoga; calligraphy; woodworking; swimming; pottery;
juggling; cycling; hiking; origami; playing the piano; drawing comics; stargazing; fishing;
skateboarding; sewing; board games; salsa dancing; journaling; playing the drums; bouldering;
baking cakes; embroidery; learning magic tricks; trail running; playing the ukulele; sketching;
model trains; beekeeping; tennis; surfing; crossword puzzles; making candles; jigsaw puzzles
"""))

# --- general-knowledge topics ---------------------------------------------------------------

pool("concept", words("""
photosynthesis; gravity; evaporation; the water cycle; electricity; magnetism; plate tectonics;
the greenhouse effect; vaccination; DNA; black holes; rainbows; the seasons; ocean tides;
volcanoes; earthquakes; sound waves; friction; static electricity; the immune system; digestion;
erosion; fermentation; nuclear fusion; solar eclipses; the phases of the moon; lightning;
condensation; osmosis; inertia; buoyancy; refraction of light; the carbon cycle; antibiotics;
blood circulation; the purpose of sleep; cloud formation; ocean currents; the northern lights;
metamorphosis in butterflies; pollination; composting; rust; inflation; interest rates;
supply and demand; compound interest; recycling; machine learning; encryption; the food chain;
evolution by natural selection; the speed of light; atoms and molecules; the Doppler effect;
echolocation; hibernation; the ozone layer; acid rain; photosynthesis in algae; centripetal force;
heat conduction; the placebo effect; habit formation; opportunity cost; leap years; time zones;
the scientific method; probability; renewable energy; carbon dating; the boiling point of water
"""))

pool("device", words("""
a refrigerator; a microwave oven; an electric motor; a bicycle gear system; a thermostat;
a credit card payment; a compass; a heat pump; noise-cancelling headphones; a touchscreen;
an elevator; a pin tumbler lock; a hot air balloon; an airplane wing; a submarine; a 3D printer;
a QR code; a password manager; cloud storage; a search engine; a solar panel; a battery; GPS;
Wi-Fi; a smoke detector; a dishwasher; a pressure cooker; an induction hob; a barcode scanner;
a camera lens; a wind turbine; a water filter; a thermos flask; a sewing machine; a lighthouse;
a parachute; a toaster; a washing machine; a digital thermometer; an escalator; a dam
"""))

pool("animal", words("""
octopus; honeybee; elephant; emperor penguin; bottlenose dolphin; barn owl; garden snail;
giraffe; hedgehog; red panda; axolotl; camel; kangaroo; green sea turtle; gray wolf; hummingbird;
chameleon; three-toed sloth; beaver; polar bear; leafcutter ant; crow; jellyfish; koala; lion;
tree frog; salmon; fruit bat; seahorse; giant tortoise; zebra; sea otter; flamingo; platypus;
moose; orca; raccoon; red squirrel; peacock; cheetah; snow leopard; pangolin; manta ray; puffin;
capybara; meerkat; narwhal; lynx; walrus; firefly; arctic fox; tapir
"""))

pool("food", words("""
oats; spinach; blueberries; lentils; yogurt; almonds; sweet potatoes; salmon; eggs; broccoli;
green tea; dark chocolate; bananas; chickpeas; brown rice; avocados; garlic; apples; carrots;
quinoa; black beans; mushrooms; walnuts; oranges; tofu; kale; sardines; pumpkin seeds;
beetroot; kiwi fruit; cauliflower; barley; peas; ginger; cabbage
"""))

pool("goal", words("""
sleep better; save money on groceries; stay focused while studying; improve my handwriting;
make friends in a new city; reduce my screen time; keep houseplants alive; run my first 5K;
be more productive in the morning; reduce food waste at home; speak more confidently in meetings;
organize my closet; remember people's names; start journaling; drink more water;
stop procrastinating; learn to swim as an adult; budget for a holiday; keep my laptop running fast;
write clearer emails; memorize vocabulary faster; make my home more energy efficient;
get better at public speaking; read more books; cook more meals at home; keep a tidy desk;
improve my posture; stick to a new habit; manage stress before exams; wake up earlier;
take better photos with my phone; learn to touch-type; plan a small garden; reduce plastic at home;
stay motivated when working from home; keep in touch with old friends; prepare for a long hike;
cut down on sugar; make my morning commute more pleasant; improve my memory
"""))

pool("compare_pair", [
    ("weather", "climate"), ("a virus", "a bacterium"), ("a comet", "an asteroid"),
    ("a crocodile", "an alligator"), ("baking soda", "baking powder"), ("a lake", "a pond"),
    ("a frog", "a toad"), ("RAM", "storage"), ("speed", "velocity"), ("a simile", "a metaphor"),
    ("an ocean", "a sea"), ("a hurricane", "a tornado"), ("a rabbit", "a hare"), ("mass", "weight"),
    ("a fruit", "a vegetable"), ("a stock", "a bond"), ("a debit card", "a credit card"),
    ("a moth", "a butterfly"), ("a dolphin", "a porpoise"), ("jam", "jelly"), ("a cold", "the flu"),
    ("an emigrant", "an immigrant"), ("latitude", "longitude"), ("a meteor", "a meteorite"),
    ("HTTP", "HTTPS"), ("an atom", "a molecule"), ("a star", "a planet"), ("a mountain", "a hill"),
    ("a violin", "a viola"), ("espresso", "filter coffee"), ("a novel", "a novella"),
    ("hardware", "software"), ("an LED bulb", "an incandescent bulb"), ("a river", "a stream"),
    ("a seal", "a sea lion"), ("a cheetah", "a leopard"), ("a bay", "a gulf"),
    ("a recession", "a depression"), ("a prefix", "a suffix"), ("an alloy", "a compound"),
    ("AC", "DC electricity"), ("a glacier", "an iceberg"), ("a herb", "a spice"),
    ("a duvet", "a quilt"), ("a cyclone", "a typhoon"), ("a wasp", "a bee"),
])


pool("history", words("""
the printing press; the invention of the telephone; the ancient Olympic Games; the Silk Road;
the first moon landing; Roman aqueducts; the Great Wall of China; the pyramids of Giza;
the Industrial Revolution; the history of chocolate; the first airplanes; the origin of paper money;
the history of the bicycle; the invention of the light bulb; ancient Greek theater;
the history of tea; the invention of the compass; the history of the postal service;
the Viking Age; the Renaissance; the invention of the steam engine; the history of the calendar;
the first vaccines; the history of the piano; the invention of photography; the age of sail;
the history of public libraries; the invention of the radio; the first railways;
the history of the Olympic torch relay; the invention of the telescope; the history of coffee houses
"""))

pool("myth", words("""
goldfish only have a three-second memory; we only use ten percent of our brains;
lightning never strikes the same place twice; bats are blind;
cracking your knuckles causes arthritis; bulls are angered by the color red;
the Great Wall of China is visible from space with the naked eye;
chameleons change color to match their background; sugar makes children hyperactive;
camels store water in their humps; ostriches bury their heads in the sand;
hair grows back thicker after shaving; dogs see only in black and white;
the tongue has separate zones for each taste; humans have only five senses;
you need to wait 24 hours before reporting a missing person;
eating carrots gives you night vision; bananas grow on trees;
a penny dropped from a skyscraper could kill someone; we swallow spiders in our sleep;
reading in dim light damages your eyes; mice love cheese more than any other food;
you lose most of your body heat through your head; deoxygenated blood is blue
"""))

pool("word", words("""
ephemeral; meticulous; resilient; ubiquitous; candid; frugal; serene; tenacious; whimsical;
pragmatic; eloquent; diligent; nostalgic; ambiguous; benevolent; gregarious; inevitable; lucid;
nimble; obscure; prudent; robust; skeptical; tranquil; versatile; zealous; meander; cultivate;
scrutinize; alleviate; mundane; vivid; sparse; reluctant; thrive; tedious; abundant; cautious;
elaborate; fragile; gullible; hospitable; impartial; jubilant; keen; lenient; mellow
"""))

pool("option", words("""
working from home; owning an electric car; living in a big city; taking online classes;
renting instead of buying a home; a four-day work week; commuting by public transport;
installing solar panels; eating out often; raising children to speak two languages;
buying second-hand clothes; wearing a smartwatch; open-plan offices; reading e-books instead of
paper books; studying abroad for a year; having a dog in a small apartment; getting a part-time job
while studying; living with roommates; cooking meals in bulk on Sundays; taking a gap year;
learning to code as a teenager; cycling to work; working at a startup; shopping at local markets;
keeping a paper diary; using a standing desk; traveling by train instead of flying
"""))

pool("plant", words("""
snake plant; basil plant; orchid; tomato plant; succulent; Boston fern; peace lily;
rosemary bush; cactus; monstera; spider plant; bonsai tree; lavender; aloe vera; pothos;
fiddle-leaf fig; mint plant; rubber plant; money tree; chili pepper plant
"""))

pool("pet", words("""
cat; dog; rabbit; guinea pig; parrot; hamster; tortoise; goldfish; ferret; bearded dragon;
budgie; chinchilla
"""))

pool("why_question", words("""
Why do cats purr?; Why do leaves change color in autumn?; Why do we yawn?;
Why do onions make us cry?; Why do stars twinkle?; Why does bread dough rise?;
Why do birds migrate?; Why do our ears pop on airplanes?; Why does ice float on water?;
Why do we get goosebumps?; Why does the moon seem to change shape?;
Why do some people get motion sickness?; Why do our fingers wrinkle in water?;
Why do dogs wag their tails?; Why is the ocean salty?; Why do we have fingerprints?;
Why does metal feel colder than wood?; Why do we hiccup?; Why is the sky dark at night?;
Why do zebras have stripes?; Why does popcorn pop?; Why do we dream?;
Why do apples turn brown after you cut them?; Why do roosters crow in the morning?;
Why does a spoon look bent in a glass of water?; Why do bees make honey?;
Why does hot air rise?; Why do we get hungry?; Why do some trees lose their leaves in winter?;
Why do cats land on their feet?; Why does soap remove grease?; Why do we blink?
"""))

pool("dish", words("""
vegetable soup; banana bread; pancakes; a tomato pasta sauce; chicken curry; guacamole;
fried rice; lentil stew; a simple omelette; hummus; oatmeal cookies; a Greek salad;
mushroom risotto; fish tacos; pumpkin soup; shakshuka; garlic bread; potato salad;
chili con carne; a tofu stir-fry; apple crumble; French toast; minestrone soup; a frittata;
carrot cake; falafel; coleslaw; a lemon drizzle cake; a bean burrito; roasted vegetables;
pea and mint soup; a chickpea curry; homemade pizza dough; flapjacks
"""))

pool("poem_topic", words("""
the first snow of winter; a lighthouse at night; an old bicycle; morning coffee;
a city after rain; a lost umbrella; autumn leaves; a cat watching birds; the sea at dawn;
a quiet library; a summer thunderstorm; a garden in spring; the last day of school;
a train journey; the moon over a lake; a busy market; a kite in the wind; an empty playground;
fresh bread; a mountain trail; a grandmother's kitchen; a firefly in June; a paper boat;
the smell of rain; a long-distance friendship; an old map; the hum of a fridge at midnight
"""))

pool("email_request", [
    ("manager", "for a day off next Friday"), ("landlord", "to fix the heating in my apartment"),
    ("neighbor", "to keep the music down after ten at night"), ("professor", "for an extension on my essay"),
    ("team", "to move our weekly meeting to Thursday"), ("neighbor", "to borrow their ladder this weekend"),
    ("coach", "whether I can miss practice next week"), ("landlord", "for permission to paint my bedroom"),
    ("manager", "about working from home two days a week"), ("colleague", "for help with a spreadsheet"),
    ("child's teacher", "for a meeting about homework"), ("dentist's office", "to reschedule my appointment"),
    ("book club", "to suggest a new meeting place"), ("gym", "to pause my membership for a month"),
    ("team", "for volunteers to organize the office party"), ("former teacher", "for a reference letter"),
    ("client", "for feedback on the draft design"), ("building manager", "about a leaking pipe in the hallway"),
    ("local council", "about a broken streetlight on my road"), ("supplier", "for an updated price list"),
])

pool("person_type", words("""
university student; retired teacher; young family with two children; freelance designer;
nurse who works night shifts; small business owner; first-time home buyer; teenager;
new graduate; parent who works from home; person with a long commute; couple in their sixties
"""))

pool("business", words("""
small bakery; dog-walking service; bike repair shop; bookshop café; plant nursery;
tutoring business; yoga studio; taco food truck; second-hand clothing store; house-cleaning company;
podcast about history; board game café; coffee roastery; ice cream stand; phone repair shop;
children's music school; vegan burger restaurant; pottery studio; local newsletter;
climbing gym; craft brewery; photography studio; flower shop; pet grooming salon
"""))

pool("language_learn", words("""
Spanish; Japanese; Italian; German; Portuguese; Korean; French; Mandarin Chinese; Dutch; Swedish;
Greek; Arabic; Turkish; Polish; Hindi; Swahili; Norwegian; Vietnamese
"""))

pool("announce_event", words("""
our school's spring bake sale; a community beach cleanup on Saturday;
the opening of a new neighborhood library; a charity 5K run in the park;
our office's end-of-year party; a free coding workshop for teenagers;
a farmers' market that starts next week; a book club's first meeting; a neighborhood garage sale;
a chess tournament at the community center; a tree-planting day in the local park;
a swap shop for children's clothes; an open day at the fire station;
a repair café where volunteers fix broken toasters and lamps; a summer reading challenge for kids;
a talent show at the retirement home; a blood donation drive at work; a film night in the town square
"""))

pool("story_char", words("""
shy dragon; curious robot; old fisherman; lost kitten; young inventor; talking tree;
clumsy wizard; brave mouse; lighthouse keeper; retired astronaut; nervous ghost; tiny snail;
grumpy baker; kind giant; forgetful owl; street musician; young detective; friendly cloud;
lonely scarecrow; runaway balloon; sleepy bear
"""))
pool("story_goal", words("""
wants to learn to fly; finds a mysterious map; must deliver a letter before sunset;
tries to win a baking contest; befriends a lonely whale; loses their voice before a big concert;
discovers a secret garden; has to find a missing key; wants to see the ocean for the first time;
builds a boat out of old furniture; tries to stop a storm; opens a tiny restaurant;
gets lost in a library; wants to make the whole town laugh; finds a door that wasn't there yesterday;
learns to be patient; has to cross a frozen river
"""))

pool("ingredient", words("""
eggs; spinach; cheese; rice; a can of chickpeas; tomatoes; an onion; potatoes; leftover chicken;
mushrooms; a bell pepper; pasta; frozen peas; tofu; a courgette; yogurt; a tin of tuna; carrots;
lentils; a bag of kale; half a cabbage; sweet potatoes; bread; feta cheese; coconut milk
"""))

pool("trip_type", words("""
three-day hiking trip in the mountains; week at the beach; ski weekend; city break in winter;
long train journey; summer music festival; two-day business trip; camping trip with kids;
cycling tour; trip to visit my grandparents; sailing weekend; road trip across the country;
backpacking trip; weekend at a lake cabin
"""))

STUDY_SUBJECTS = {
    "biology": ["cell division", "genetics", "the nervous system", "ecology"],
    "chemistry": ["balancing equations", "the periodic table", "acids and bases", "organic molecules"],
    "history": ["dates and timelines", "essay writing", "source analysis", "the causes of wars"],
    "algebra": ["quadratic equations", "word problems", "graphing functions", "inequalities"],
    "physics": ["electric circuits", "forces and motion", "waves", "energy conservation"],
    "geography": ["map reading", "climate zones", "population statistics", "rivers and erosion"],
    "economics": ["supply and demand graphs", "inflation", "market structures", "exchange rates"],
    "statistics": ["probability", "hypothesis testing", "standard deviation", "reading charts"],
    "English literature": ["poetry analysis", "quotations", "character themes", "timed essays"],
    "computer science": ["recursion", "sorting algorithms", "binary numbers", "databases"],
}
pool("subject", list(STUDY_SUBJECTS))

pool("debate", words("""
pineapple belongs on pizza; cats make better pets than dogs; it's better to arrive early than exactly on time;
books are always better than their film adaptations; breakfast is the most important meal of the day;
summer is better than winter; it's rude to recline your seat on a plane; homework should be banned;
it's fine to wear socks with sandals; tea is better than coffee; paper maps are better than phone maps;
you should make your bed every morning; it's okay to read the last page of a novel first;
board games are more fun than video games; it's better to save money than to travel
"""))

# --- held-out only slot lists (used only by held-out templates) -------------------------------

HO_LIMERICK = ["a penguin who hates the cold", "a forgetful dentist", "a snail in a hurry",
               "a cat who learned to type", "a very tall giraffe at the cinema", "a soup that was too salty",
               "a goat who ate the homework", "a sleepy night watchman", "a bicycle with a squeaky wheel"]
HO_MOVE_TO = ["a small fishing village", "a busy capital city", "a farm in the countryside",
              "a town in the mountains", "a city in a different country", "an island with one ferry a day",
              "a houseboat on a canal", "a suburb far from my office"]
HO_KID_Q = ["we have to brush our teeth", "snails carry their shells around", "bread goes moldy",
            "our voices sound strange on a recording", "we can't breathe underwater", "shadows get longer in the evening",
            "people speak different languages", "ice cream melts so fast in summer"]
HO_LIFE_EVENT = ["moving to a new apartment", "adopting a rescue dog", "starting university",
                 "the first week at a new job", "a long-haul flight with a toddler", "hosting overnight guests",
                 "a first camping trip", "getting a house ready for winter"]
HO_INSTRUMENT = ["cello", "harmonica", "banjo", "saxophone", "mandolin", "accordion", "trumpet"]


def pick_town(c) -> str:
    return c.pick("town_prefix") + c.rng.choice(TOWN_SUFFIXES)


def pick_company(c) -> tuple[str, str, str]:
    """(company name, sector description, product)"""
    sector = c.pick("sector")
    desc, products = SECTORS[sector]
    return f"{c.pick('company_prefix')} {sector}", desc, c.rng.choice(products)


def full_name(c) -> str:
    return f"{c.pick('name')} {c.pick('surname')}"


def a_an(phrase: str) -> str:
    first = phrase.split()[0].lower()
    vowel = first[0] in "aeiou" and not first.startswith(("uni", "use", "eu", "one"))
    if first in ("hour", "honest", "heir") or first.isupper() and first[0] in "AEFHILMNORSX":
        vowel = True
    return ("an " if vowel else "a ") + phrase


NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve"]


def nw(n: int) -> str:
    """Small numbers as words (news style); larger ones as digits."""
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else str(n)


def cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def join_and(items: list[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class Ctx:
    """Random source + split-aware access to the slot pools.

    pick() and choice() draw *without replacement* (a shuffled deck per list, refilled when
    empty), so every slot value is used about equally often and repeats are spread out.
    """

    def __init__(self, split: str, rng: random.Random):
        self.split = split
        self.rng = rng
        self._decks: dict[tuple, list] = {}

    def pool(self, name: str) -> list:
        return POOLS[name][self.split]

    def _draw(self, seq):
        key = tuple(seq)
        deck = self._decks.get(key)
        if not deck:
            deck = list(key)
            self.rng.shuffle(deck)
            self._decks[key] = deck
        return deck.pop()

    def pick(self, name: str):
        return self._draw(self.pool(name))

    def sample(self, name: str, k: int) -> list:
        return self.rng.sample(self.pool(name), k)

    def choice(self, seq):
        return self._draw(seq)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def fill(self, template: str, **fixed) -> str:
        """Replace {pool} / {pool#2} placeholders with values from the split's pools."""
        values: dict[str, object] = dict(fixed)
        used: dict[str, list] = {}

        def rep(m: re.Match) -> str:
            key, base = m.group(0)[1:-1], m.group(1)
            if key not in values:
                article = base.endswith("_a") and base[:-2] in POOLS  # {job_a} -> "a nurse"
                src = base[:-2] if article else base
                if src not in POOLS:
                    raise KeyError(f"unknown slot {base!r} in {template!r}")
                for _ in range(50):
                    v = self.pick(src)
                    if v not in used.get(base, []):
                        break
                used.setdefault(base, []).append(v)
                values[key] = a_an(v) if article else v
            return str(values[key])

        return re.sub(r"\{([a-z_]+)(?:#\d)?\}", rep, template)


# ----------------------------------------------------------------------------------------
# Template registry.  A template is a function Ctx -> list of turns (strings).
# ----------------------------------------------------------------------------------------

TEMPLATES: dict[str, dict[str, list]] = {c: {"train": [], "heldout": []} for c in CATEGORIES}


def template(category: str, heldout: bool = False):
    def deco(fn):
        TEMPLATES[category]["heldout" if heldout else "train"].append(fn)
        return fn
    return deco


def fill_templates(category: str, strings: list[str], heldout: bool = False) -> None:
    """Register simple one-turn templates made of {slot} placeholders."""
    for s in strings:
        def fn(c, s=s):
            return [c.fill(s)]
        fn.__name__ = f"{category}:{s[:40]}"
        TEMPLATES[category]["heldout" if heldout else "train"].append(fn)


# ======================================= qa ================================================

fill_templates("qa", [
    "Explain {concept} in simple terms.",
    "Can you explain {concept} to a ten-year-old?",
    "How does {device} work?",
    "What are three interesting facts about the {animal}?",
    "Where does the {animal} live, and what does it eat?",
    "What does {job_a} do on a typical working day?",
    "What skills and qualifications do you need to become {job_a}?",
    "How can I {goal}?",
    "Give me five practical tips to {goal}.",
    "What are the health benefits of eating {food}?",
    "Give me a short overview of {history}.",
    "I'm a beginner at {hobby}. What mistakes should I avoid?",
    "Is it true that {myth}? Please explain briefly.",
    "What does the word \"{word}\" mean? Use it in a sentence.",
    "What are the advantages and disadvantages of {option}?",
    "How do I take care of {plant_a}?",
    "{why_question}",
    "{why_question} Please keep the answer short.",
    "What should I know before getting {pet_a}?",
    "What is the capital of {country}, and what is it known for?",
    "What are some traditional dishes from {country}?",
])


@template("qa")
def qa_compare(c):
    a, b = c.pick("compare_pair")
    return [c.choice([
        f"What is the difference between {a} and {b}?",
        f"How can I tell {a} from {b}?",
        f"Is {a} the same thing as {b}? Explain the difference.",
    ])]


@template("qa")
def qa_word_pair(c):
    w1, w2 = c.sample("word", 2)
    return [f"What is the difference in meaning between \"{w1}\" and \"{w2}\"? Give an example sentence for each."]


# held-out only templates
fill_templates("qa", [
    "In two or three sentences, describe what {concept} is and why it matters.",
    "What kind of training does {job_a} need, and how long does it usually take?",
    "What is the most surprising thing about the {animal}?",
    "Name three common mistakes people make when they try to {goal}, and how to avoid them.",
    "Give me a balanced opinion: is {option} a good idea?",
    "Describe {history} in a short paragraph suitable for a school report.",
], heldout=True)


@template("qa", heldout=True)
def qa_ho_device(c):
    d = c.pick("device")
    return [f"Imagine you are explaining {d} to someone from the year 1800. How does it work?"]


# =================================== multi_turn ============================================

MULTI_TURN = [
    ("I'm planning a {days}-day trip to {city}. What should I see and do?",
     ["Which of those would be best on a rainy day?", "Can you turn that into a day-by-day plan?",
      "What local food should I try while I'm there?", "I'm traveling on a tight budget. What would you change?"]),
    ("Can you give me a simple recipe for {dish}?",
     ["How can I make it vegetarian?", "How long will the leftovers keep in the fridge?",
      "Can you scale it up to serve {n} people?", "What side dish would go well with it?",
      "I don't have an oven, only a stovetop. Can I still make it?"]),
    ("What are some good ways to get started with {hobby}?",
     ["I only have about {minutes} minutes a day. How should I plan my practice?",
      "What equipment do I really need, and what can I skip?", "How will I know I'm making progress?"]),
    ("Explain {concept} in simple terms.",
     ["Can you give me an everyday example?", "Now explain it as if I were five years old.",
      "What is a common misconception about it?", "Can you sum that up in one sentence?"]),
    ("Write a short poem about {poem_topic}.",
     ["Now make it rhyme, in four lines.", "Rewrite it in a more cheerful tone.",
      "Give the poem a title and explain the imagery you used."]),
    ("What are the pros and cons of {option}?",
     ["Based on that, what would you recommend for {person_type_a}?",
      "Which of those points matters most, in your opinion?", "Can you put the pros and cons in a table?"]),
    ("Suggest five names for {business_a}.",
     ["Which one is best, and why?", "Can you write a short slogan for your favorite one?",
      "Make the names sound more playful."]),
    ("I want to learn {language_learn}. Where should I begin?",
     ["How long does it usually take to hold a basic conversation?",
      "Can you teach me five useful phrases to start with?", "What are good free ways to practice speaking?"]),
    ("My {plant} has yellow leaves. What could be wrong?",
     ["How often should I water it?", "Should I move it to a different spot?",
      "How can I tell if the roots are rotting?"]),
    ("Write a short announcement for {announce_event}.",
     ["Now write a version for social media, under 40 words.", "Make it sound more exciting.",
      "Add a line about what people should bring."]),
    ("Give me a {minutes}-minute workout I can do at home without equipment.",
     ["How can I make it easier for a beginner?", "What should I do to warm up first?",
      "How many times a week should I do this?"]),
    ("Help me write a birthday message for my {relative} who loves {hobby}.",
     ["Can you make it funnier?", "Make it shorter so it fits on a card.", "Now write a version that rhymes."]),
    ("Tell me a short story about {story_char_a} who {story_goal}.",
     ["Give the story a different ending.", "Retell it from the point of view of another character.",
      "What lesson could a child learn from this story?"]),
    ("What should I pack for {trip_type_a}?",
     ["What if the forecast says it will rain?", "How can I keep my bag as light as possible?",
      "Can you turn that into a checklist?"]),
    ("Give me some tips for a job interview as {job_a}.",
     ["What questions should I ask the interviewer at the end?",
      "How should I answer \"What is your biggest weakness?\"", "What should I wear to the interview?"]),
    ("My friend and I are arguing about whether {debate}. What do you think?",
     ["Can you give the strongest argument for the other side?", "How could we settle this in a fun way?"]),
    ("Can you suggest a simple daily routine to help me {goal}?",
     ["What if I only have time in the evenings?", "How long before I notice a difference?",
      "What should I do on days when I feel unmotivated?"]),
    ("{why_question}",
     ["Can you explain that more simply?", "Is there a simple experiment I could do to see this myself?",
      "What else happens for a similar reason?"]),
    ("What are some fun facts about the {animal}?",
     ["Is it endangered?", "How does it protect itself from predators?",
      "Write a short poem about it using one of those facts."]),
]


def _mt_fn(first: str, follow: list[str]):
    def fn(c):
        vals = {"days": c.choice([2, 3, 4, 5, 7]), "n": c.choice([6, 8, 10, 12, 20]),
                "minutes": c.choice([10, 15, 20, 30, 45])}
        job = c.pick("job")
        vals["job_a"] = a_an(job)
        turn1 = c.fill(first, **{k: v for k, v in vals.items() if "{" + k in first})
        turn2 = c.fill(c.choice(follow), **vals)
        return [turn1, turn2]
    fn.__name__ = f"multi_turn:{first[:40]}"
    return fn


for _first, _follow in MULTI_TURN:
    TEMPLATES["multi_turn"]["train"].append(_mt_fn(_first, _follow))


@template("multi_turn")
def mt_email(c):
    who, what = c.pick("email_request")
    return [f"Write a short email to my {who} asking {what}.",
            c.choice(["Make it a bit more formal.", "Now make it shorter, just two or three sentences.",
                      "Add a polite thank-you at the end and suggest a time to talk.",
                      "Make it sound friendlier and less stiff."])]


@template("multi_turn")
def mt_cook(c):
    items = c.sample("ingredient", c.choice([3, 4]))
    return [f"I have {join_and(items)} in my kitchen. What can I cook for dinner?",
            c.choice(["Which of those ideas takes the least time?", "Which one is the healthiest?",
                      "I don't have an oven. Does that change anything?",
                      "Can you write out the steps for the first idea?"])]


@template("multi_turn")
def mt_study(c):
    subject = c.pick("subject")
    sub = c.choice(STUDY_SUBJECTS[subject])
    days = c.choice([3, 5, 7, 10, 14])
    return [f"Can you make a {days}-day study plan for my {subject} exam?",
            c.choice([f"I'm weakest at {sub}. How should I change the plan?",
                      "How should I take breaks during the day?",
                      f"What is a good way to revise {sub}?"])]


@template("multi_turn")
def mt_compare(c):
    a, b = c.pick("compare_pair")
    return [f"What is the difference between {a} and {b}?",
            c.choice(["Which one do people confuse more often, and why?", "Can you give an example of each?",
                      "Summarize the difference in one sentence.", "Is there an easy way to remember it?"])]


# held-out multi-turn templates (own slot lists)

@template("multi_turn", heldout=True)
def mt_ho_dinner(c):
    n = c.choice([4, 5, 6, 8])
    diet = c.choice(["vegan", "gluten-free", "allergic to nuts", "vegetarian", "lactose intolerant"])
    return [f"I'm hosting dinner for {n} friends and one of them is {diet}. Can you suggest a menu?",
            c.choice(["What can I prepare the day before?", "Can you suggest a dessert that everyone can eat?",
                      "How should I time the cooking so everything is ready together?"])]


@template("multi_turn", heldout=True)
def mt_ho_limerick(c):
    return [f"Write a limerick about {c.choice(HO_LIMERICK)}.",
            c.choice(["Now write another one from a different angle.",
                      "Explain what makes a limerick a limerick."])]


@template("multi_turn", heldout=True)
def mt_ho_move(c):
    return [f"I'm thinking about moving to {c.choice(HO_MOVE_TO)}. What should I consider first?",
            c.choice(["What questions should I ask people who already live there?",
                      "How can I test whether I'd like it before I commit?"])]


@template("multi_turn", heldout=True)
def mt_ho_future(c):
    job = c.pick("job")
    return [f"Describe a typical day for {a_an(job)} in the year 2050.",
            c.choice(["What new skills would they need?", "Which parts of the job would stay the same?"])]


@template("multi_turn", heldout=True)
def mt_ho_kid(c):
    age = c.choice([4, 5, 6, 7, 8])
    return [f"How do I explain to my {age}-year-old why {c.choice(HO_KID_Q)}?",
            c.choice(["What if they ask a follow-up question I can't answer?",
                      "Can you suggest a simple activity to go with the explanation?"])]


@template("multi_turn", heldout=True)
def mt_ho_instrument(c):
    return [f"I just got my first {c.choice(HO_INSTRUMENT)}. How should I practice during the first month?",
            c.choice(["How do I stay motivated when progress feels slow?", "How long should each practice session be?"])]


@template("multi_turn", heldout=True)
def mt_ho_party(c):
    age = c.choice([30, 40, 50, 60, 70, 80])
    return [f"Help me plan a surprise party for my {c.pick('relative')}'s {age}th birthday.",
            c.choice(["What's the best way to keep it a secret?", "Suggest a theme and a simple menu."])]


@template("multi_turn", heldout=True)
def mt_ho_checklist(c):
    return [f"Create a short checklist for {c.choice(HO_LIFE_EVENT)}.",
            c.choice(["Which items on the list are the most urgent?", "Can you group the list by week?"])]


# =================================== translation ===========================================

TARGET_LANGS = ["French", "German", "Spanish", "Italian", "Portuguese", "Dutch"]

pool("place", words("""
pharmacy; post office; train station; bakery; library; supermarket; swimming pool; bank; museum;
bus stop; hospital; cinema; bookshop; hardware store; police station; park; petrol station;
laundrette; market; dentist; gym; playground; ferry terminal; tourist office
"""))
pool("bring_item", words("""
umbrella; passport; laptop; lunch box; gym shoes; library card; notebook; camera; sunscreen;
water bottle; phone charger; student card; swimming costume; guitar; calculator; recipe book
"""))
pool("skill", words("""
play the violin; speak Italian; bake bread; drive; swim; paint; dance the tango; knit; play chess;
write code; ride a motorbike; sing; play the flute; make sushi; surf; sew my own clothes; juggle
"""))
pool("shop_item", words("""
jacket; lamp; bicycle; pair of shoes; teapot; backpack; watch; rug; chair; scarf; tent; kettle;
suitcase; coffee table; mirror; pair of headphones; raincoat; cookbook
"""))
pool("landmark", words("""
old bridge; cathedral; opera house; harbor; town hall; main square; botanical garden;
clock tower; city museum; river; castle; lighthouse; fountain; old market hall; university
"""))
pool("indoor", words("""
played cards; baked cookies; watched old films; did a jigsaw puzzle; read books; painted the kitchen;
wrote letters; tidied the attic; played board games; made pizza from scratch; listened to records
"""))
pool("invite_event", words("""
wedding; birthday party; graduation party; housewarming party; garden party; retirement dinner;
barbecue; New Year's party; engagement party
"""))
pool("help_with", words("""
move; presentation; report; school project; job application; garden; wedding preparations;
tax forms; new website; science fair project
"""))
pool("simple_food", words("soup; cake; bread; salad; curry; pie; sauce; stew; lasagna; tart; risotto; chutney"))
pool("fridge_food", words("""
some pasta; leftover soup; a bit of rice and vegetables; half a pizza; some chicken salad;
fresh bread and cheese; a pot of chili; a bowl of cold noodles
"""))
pool("en_fixed", words("""
I'm sorry I'm late; the bus was stuck in traffic.;
Can I pay by card, or do you only take cash?;
I think I left my phone on the kitchen table.;
We should leave early to avoid the traffic.;
The soup is too hot to eat right now.;
My brother is taller than me, but I am older.;
Excuse me, is this seat taken?;
It's my first time in this city, and I love it already.;
The shop on the corner sells the best bread in town.;
I can't find my glasses anywhere.;
We watched the sunset from the top of the hill.;
She always drinks a cup of tea before going to bed.;
How long does it take to walk to the beach from here?;
The printer on the second floor is out of paper again.;
My grandmother grows tomatoes and herbs on her balcony.;
Let's meet in front of the theater at seven.;
He has been reading the same book for three months.;
The concert was cancelled because of the storm.;
I need to buy a birthday present for my best friend.;
Our flight was delayed by two hours.;
The dog ran across the field and jumped into the lake.;
Do you have this jacket in a smaller size?;
I usually go running before breakfast.;
The new café downstairs makes excellent hot chocolate.;
We are out of milk, so I'll go to the shop.;
This street is very quiet at night.;
My computer keeps freezing when I open too many tabs.;
Happy birthday! I hope all your wishes come true.;
The kids built a huge sandcastle at the beach yesterday.;
Is breakfast included in the price of the room?;
I missed the last bus, so I took a taxi home.;
Our team won the match in the last minute.;
The mountains look beautiful covered in snow.;
I have never seen so many stars in the sky.;
Turn left at the second traffic light and the hotel is on your right.;
Could I have the bill, please?;
The baby finally fell asleep after an hour of singing.;
I'd rather stay home tonight and watch a film.;
Congratulations on your new job! You deserve it.;
Would you like to join us for lunch on Friday?
"""), heldout_frac=0.2)

WEATHER = [("rainy", "umbrella"), ("sunny and hot", "sunglasses"), ("very cold", "gloves"),
           ("windy", "warm jacket"), ("snowy", "boots"), ("foggy", "flashlight")]
SEASONS = [("spring", "the trees are full of blossoms"), ("summer", "the days are long and warm"),
           ("autumn", "I love the colors of the leaves"), ("winter", "I enjoy the snow and hot drinks")]
WHEN = ["this afternoon", "tomorrow morning", "after lunch", "on Saturday", "later today",
        "before work", "next week", "tonight"]


def _hour(c) -> int:
    return c.choice([5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4])


# each returns one English sentence (or a two-sentence note)
EN_SENTENCES_TRAIN = [
    lambda c: f"{c.pick('name')} is going to the {c.pick('place')} {c.choice(WHEN)}.",
    lambda c: f"Could you tell me where the nearest {c.pick('place')} is?",
    lambda c: f"We are planning to visit {c.pick('city')} in {c.choice(MONTHS)}.",
    lambda c: f"My {c.pick('relative')} works as {a_an(c.pick('job'))} in {c.pick('city')}.",
    lambda c: f"The meeting has been moved to {c.choice(WEEKDAYS)} at {_hour(c)} o'clock.",
    lambda c: f"I would like to book a table for {c.choice([2, 3, 4, 5, 6, 8])} people at {c.choice([7, 8, 9])} o'clock, please.",
    lambda c: f"It rained all afternoon, so we stayed inside and {c.pick('indoor')}.",
    lambda c: f"The train to {c.pick('city')} leaves in {c.choice([5, 10, 15, 20, 25])} minutes from platform {c.choice(range(1, 13))}.",
    lambda c: f"Please remember to bring your {c.pick('bring_item')} tomorrow.",
    lambda c: f"I have been learning to {c.pick('skill')} for {c.choice([2, 3, 4, 6, 8, 10])} months.",
    lambda c: f"This {c.pick('simple_food')} is delicious. Could I have the recipe?",
    lambda c: f"How much does this {c.pick('shop_item')} cost?",
    lambda c: f"The museum is closed on {c.choice(WEEKDAYS)}s, but the garden is open every day.",
    lambda c: f"Our neighbors have a {c.pick('pet')} called {c.pick('name')}.",
    lambda c: "{0} and {1} met at a café near the {2}.".format(*c.sample("name", 2), c.pick("landmark")),
    lambda c: f"Do you know if the {c.pick('place')} is open on Sundays?",
    lambda c: "The forecast says it will be {0} tomorrow, so don't forget your {1}.".format(*c.choice(WEATHER)),
    lambda c: f"Thank you for your help with the {c.pick('help_with')}. I really appreciate it.",
    lambda c: "My favorite season is {0} because {1}.".format(*c.choice(SEASONS)),
    lambda c: f"Hi {c.pick('name')}, I'll be home late tonight. There is {c.pick('fridge_food')} in the fridge if you're hungry.",
    lambda c: f"Dear {c.pick('name')}, thank you for inviting me to your {c.pick('invite_event')}. Unfortunately, I can't come because I will be in {c.pick('city')} that week.",
    lambda c: f"{c.pick('name')} has lived in {c.pick('city')} for {c.choice([2, 3, 5, 10, 12, 20])} years and still gets lost in the old town.",
    lambda c: f"The {c.pick('shop_item')} I ordered online arrived broken, so I would like a refund.",
    lambda c: f"If the weather is nice on {c.choice(WEEKDAYS)}, we could have a picnic by the {c.pick('landmark')}.",
    lambda c: c.pick("en_fixed"),
    lambda c: c.pick("en_fixed"),
    lambda c: " ".join(c.sample("en_fixed", 2)),
]

EN_SENTENCES_HELDOUT = [
    lambda c: f"The reading room will stay open until {c.choice([9, 10, 11])} o'clock during exam week.",
    lambda c: f"{c.pick('name')} left the keys at the office and had to wait outside for an hour.",
    lambda c: f"Is there {a_an(c.pick('place'))} somewhere near the {c.pick('landmark')}?",
    lambda c: "We missed the last ferry, so we spent the night in a small hotel by the harbor.",
    lambda c: f"Could you water my plants while I'm away for {c.choice([3, 4, 5, 10])} days?",
    lambda c: c.pick("en_fixed"),
    lambda c: c.pick("en_fixed"),
]


def en_sentence(c) -> str:
    gens = EN_SENTENCES_HELDOUT if c.split == "heldout" else EN_SENTENCES_TRAIN
    return c.choice(gens)(c)


EN_TO_X_TRAIN = [
    "Translate to {lang}: {s}",
    "Translate the following sentence into {lang}:\n{s}",
    "How do you say \"{s}\" in {lang}?",
    "Please translate this into {lang}: {s}",
    "Translate into {lang}, keeping the tone informal: {s}",
    "Translate this short text into {lang}:\n\n{s}",
    "What is the {lang} translation of \"{s}\"?",
    "Can you help me say this in {lang}? \"{s}\"",
    "English: {s}\n{lang}:",
    "Give me a polite {lang} version of this sentence: {s}",
    "I'm writing to a friend who speaks {lang}. How would I write: \"{s}\"",
    "Translate from English to {lang}: {s}",
    "Translate this sentence into {lang}, then explain any tricky words: {s}",
    "Translate the sentence below into {lang} and {lang2}.\n{s}",
    "Translate to {lang} (formal register): {s}",
]
EN_TO_X_HELDOUT = [
    "Convert this English sentence to {lang}: {s}",
    "My {lang}-speaking colleague needs to read this. Please translate it: {s}",
    "In {lang}, how would someone say: {s}",
]

# Simple sentences written for this project, aligned by index across languages.  Indices are
# split between train and held-out, so a held-out meaning never appears in train in any language.
FOREIGN = {
    "French": [
        "Je voudrais un café et un croissant, s'il vous plaît.",
        "Où se trouve la gare la plus proche ?",
        "Nous avons passé le week-end à la campagne chez mes grands-parents.",
        "Il fait très beau aujourd'hui, allons nous promener au parc.",
        "Ma sœur apprend à jouer du piano depuis trois ans.",
        "Le musée est fermé le lundi.",
        "Est-ce que vous pouvez m'aider à porter ces valises ?",
        "J'ai oublié mon parapluie dans le train ce matin.",
        "Le dîner sera prêt dans vingt minutes.",
        "Les enfants jouent dans le jardin pendant que leurs parents préparent le repas.",
        "Nous cherchons un appartement avec deux chambres près du centre-ville.",
        "Pourriez-vous parler un peu plus lentement, s'il vous plaît ?",
        "Mon frère travaille dans une boulangerie depuis l'été dernier.",
        "La réunion a été reportée à jeudi après-midi.",
        "J'aime lire un bon livre le dimanche matin.",
        "Il y a beaucoup de monde au marché le samedi.",
        "Combien coûte un billet pour Lyon ?",
        "Elle a acheté des fleurs pour l'anniversaire de sa mère.",
        "Nous prenons le bus tous les jours pour aller à l'école.",
        "Le film était long, mais la fin était magnifique.",
        "Pouvez-vous me recommander un bon restaurant dans le quartier ?",
        "Je suis désolé, je ne parle pas très bien français.",
        "Il faut éteindre les lumières avant de partir.",
        "Mon chat dort toute la journée sur le canapé.",
        "Cet hiver, nous irons skier dans les Alpes.",
        "La bibliothèque ouvre à neuf heures et ferme à dix-huit heures.",
        "J'ai besoin d'acheter du lait, des œufs et du pain.",
        "Le train a eu trente minutes de retard à cause de la neige.",
        "Tu veux venir au cinéma avec nous ce soir ?",
        "Mes voisins ont planté un grand pommier dans leur jardin.",
    ],
    "German": [
        "Ich hätte gern einen Kaffee und ein Stück Kuchen, bitte.",
        "Wo ist der nächste Bahnhof?",
        "Wir haben das Wochenende bei meinen Großeltern auf dem Land verbracht.",
        "Heute ist das Wetter sehr schön, lass uns im Park spazieren gehen.",
        "Meine Schwester lernt seit drei Jahren Klavier.",
        "Das Museum ist montags geschlossen.",
        "Können Sie mir bitte mit den Koffern helfen?",
        "Ich habe heute Morgen meinen Regenschirm im Zug vergessen.",
        "Das Abendessen ist in zwanzig Minuten fertig.",
        "Die Kinder spielen im Garten, während die Eltern das Essen kochen.",
        "Wir suchen eine Wohnung mit zwei Schlafzimmern in der Nähe der Innenstadt.",
        "Könnten Sie bitte etwas langsamer sprechen?",
        "Mein Bruder arbeitet seit letztem Sommer in einer Bäckerei.",
        "Die Besprechung wurde auf Donnerstagnachmittag verschoben.",
        "Am Sonntagmorgen lese ich gern ein gutes Buch.",
        "Samstags ist auf dem Markt immer viel los.",
        "Wie viel kostet eine Fahrkarte nach Hamburg?",
        "Sie hat Blumen zum Geburtstag ihrer Mutter gekauft.",
        "Wir fahren jeden Tag mit dem Bus zur Schule.",
        "Der Film war lang, aber das Ende war wunderschön.",
        "Können Sie mir ein gutes Restaurant in der Nähe empfehlen?",
        "Entschuldigung, ich spreche nicht sehr gut Deutsch.",
        "Bitte mach das Licht aus, bevor du gehst.",
        "Meine Katze schläft den ganzen Tag auf dem Sofa.",
        "Diesen Winter fahren wir zum Skifahren in die Alpen.",
        "Die Bibliothek öffnet um neun Uhr und schließt um achtzehn Uhr.",
        "Ich muss noch Milch, Eier und Brot kaufen.",
        "Der Zug hatte wegen des Schnees dreißig Minuten Verspätung.",
        "Willst du heute Abend mit uns ins Kino kommen?",
        "Unsere Nachbarn haben einen großen Apfelbaum in ihrem Garten gepflanzt.",
    ],
    "Spanish": [
        "Quisiera un café con leche y una tostada, por favor.",
        "¿Dónde está la estación de tren más cercana?",
        "Pasamos el fin de semana en el campo con mis abuelos.",
        "Hoy hace muy buen tiempo, vamos a pasear por el parque.",
        "Mi hermana aprende a tocar el piano desde hace tres años.",
        "El museo está cerrado los lunes.",
        "¿Me puede ayudar a llevar estas maletas?",
        "Esta mañana olvidé mi paraguas en el tren.",
        "La cena estará lista en veinte minutos.",
        "Los niños juegan en el jardín mientras sus padres preparan la comida.",
        "Buscamos un piso con dos habitaciones cerca del centro.",
        "¿Podría hablar un poco más despacio, por favor?",
        "Mi hermano trabaja en una panadería desde el verano pasado.",
        "La reunión se ha aplazado al jueves por la tarde.",
        "Los domingos por la mañana me gusta leer un buen libro.",
        "El mercado está muy lleno los sábados.",
        "¿Cuánto cuesta un billete a Sevilla?",
        "Ella compró flores para el cumpleaños de su madre.",
        "Tomamos el autobús todos los días para ir a la escuela.",
        "La película era larga, pero el final fue precioso.",
        "¿Me puede recomendar un buen restaurante por aquí?",
        "Lo siento, no hablo muy bien español.",
        "Hay que apagar las luces antes de salir.",
        "Mi gato duerme todo el día en el sofá.",
        "Este invierno vamos a esquiar a los Alpes.",
        "La biblioteca abre a las nueve y cierra a las seis de la tarde.",
        "Necesito comprar leche, huevos y pan.",
        "El tren llegó con treinta minutos de retraso por la nieve.",
        "¿Quieres venir al cine con nosotros esta noche?",
        "Nuestros vecinos plantaron un manzano grande en su jardín.",
    ],
}
pool("foreign_idx", list(range(30)), heldout_frac=0.2)

FOREIGN_NAME_TEMPLATES = {  # train only
    "French": ["{name} habite à {town} depuis {n} ans.", "{name} et sa famille partent en vacances en {month_fr}."],
    "German": ["{name} wohnt seit {n} Jahren in {town}.", "{name} fährt im {month_de} mit seiner Familie in den Urlaub."],
    "Spanish": ["{name} vive en {town} desde hace {n} años.", "{name} se va de vacaciones con su familia en {month_es}."],
}
MONTHS_FR = ["janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre", "octobre", "novembre", "décembre"]
MONTHS_DE = ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober", "November", "Dezember"]
MONTHS_ES = ["enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre", "octubre", "noviembre", "diciembre"]


def foreign_sentence(c) -> tuple[str, str]:
    lang = c.choice(list(FOREIGN))
    if c.split == "train" and c.chance(0.15):
        t = c.choice(FOREIGN_NAME_TEMPLATES[lang])
        m = c.rng.randrange(12)
        s = t.format(name=c.pick("name"), town=pick_town(c), n=c.choice([2, 3, 4, 5, 6, 8, 10, 15]),
                     month_fr=MONTHS_FR[m], month_de=MONTHS_DE[m], month_es=MONTHS_ES[m])
        if lang == "German" and "seiner" in s and c.chance(0.5):
            s = s.replace("seiner", "ihrer")
        return lang, s
    return lang, FOREIGN[lang][c.pick("foreign_idx")]


X_TO_EN_TRAIN = [
    "Translate to English: {s}",
    "What does \"{s}\" mean in English?",
    "Translate this {lang} sentence into English:\n{s}",
    "Can you translate this from {lang} to English? {s}",
    "I received this message in {lang}: \"{s}\" What does it say?",
    "{lang} to English, please: {s}",
]
X_TO_EN_HELDOUT = [
    "Give the English meaning of this {lang} sentence: {s}",
    "{lang}: {s}\nEnglish:",
]


def _en_to_x(tmpl: str):
    def fn(c):
        lang, lang2 = c.rng.sample(TARGET_LANGS, 2)
        s = en_sentence(c)
        if '"{s}"?' in tmpl:
            s = s.rstrip(".")  # avoid '."?'
        return [tmpl.format(lang=lang, lang2=lang2, s=s)]
    fn.__name__ = f"translation:{tmpl[:40]}"
    return fn


def _x_to_en(tmpl: str):
    def fn(c):
        lang, s = foreign_sentence(c)
        return [tmpl.format(lang=lang, s=s)]
    fn.__name__ = f"translation:{tmpl[:40]}"
    return fn


for _t in EN_TO_X_TRAIN:
    TEMPLATES["translation"]["train"].append(_en_to_x(_t))
for _t in X_TO_EN_TRAIN:
    TEMPLATES["translation"]["train"].append(_x_to_en(_t))
for _t in EN_TO_X_HELDOUT:
    TEMPLATES["translation"]["heldout"].append(_en_to_x(_t))
for _t in X_TO_EN_HELDOUT:
    TEMPLATES["translation"]["heldout"].append(_x_to_en(_t))


# ================================ passages (summarization) =================================
# Each builder returns (document noun, passage).  All facts are invented.

def _year(c, lo=1950, hi=2018) -> int:
    return c.rng.randint(lo, hi)


def _pct(c) -> int:
    return c.choice([3, 4, 5, 6, 7, 8, 9, 11, 12, 14, 15, 18, 20, 22, 25])


SERVICE_SECTORS = {"Logistics", "Mobility", "Software"}
CHEAP_SECTORS = {"Foods", "Coffee", "Textiles", "Games", "Toys", "Farms"}
ELECTRONIC_SECTORS = {"Robotics", "Energy", "Audio", "Health", "Optics", "Bikes"}


def p_product_launch(c):
    co, sector, product = pick_company(c)
    kind = co.split()[-1]
    town, founder, ceo = pick_town(c), full_name(c), full_name(c)
    month, year = c.choice(MONTHS), _year(c, 1985, 2019)
    s = [c.choice([
        f"{co}, {a_an(sector)} company based in {town}, announced on {c.choice(WEEKDAYS)} that it will {'launch' if kind in SERVICE_SECTORS else 'start selling'} {product} in {month}.",
        f"On {c.choice(WEEKDAYS)}, {town}-based {co} unveiled {product}, which it plans to {'launch' if kind in SERVICE_SECTORS else 'release'} in {month}.",
        f"The {sector} firm {co} has revealed {product}, its first new product in {c.choice(['two', 'three', 'four'])} years.",
    ])]
    s.append(c.choice([
        f"The company was founded in {year} by {founder} and now employs about {c.rng.randrange(40, 2400, 10):,} people.",
        f"Founded by {founder} in {year}, {co} has grown from a small workshop into one of the largest employers in {town}.",
    ]))
    s.append(f"According to the company, the product took {c.choice(['eighteen months', 'two years', 'three years'])} to develop and was tested by more than {c.rng.randrange(100, 2000, 50):,} volunteers.")
    if kind in SERVICE_SECTORS:
        s.append(f"Customers will pay {c.rng.randint(3, 40)} euros a month, with a free trial for the first {nw(c.choice([2, 4, 6]))} weeks.")
    else:
        price = c.rng.randint(2, 60) if kind in CHEAP_SECTORS else c.rng.randrange(39, 900, 10)
        s.append(c.choice([
            f"It will cost {price} euros and will first be sold online before reaching shops later in the year.",
            f"The launch price has been set at {price} dollars, which is lower than most competing products.",
        ]))
    s.append(c.choice([
        f"\"We wanted to make something that ordinary families can afford,\" said {ceo}, the company's chief executive.",
        f"\"This is the most important launch in our history,\" said chief executive {ceo}.",
        f"{ceo}, who became chief executive last year, said the product was designed with feedback from customers.",
    ]))
    if c.chance(0.7):
        s.append(c.choice([
            "Some analysts warned that competition in the market is strong and that sales may start slowly.",
            "Industry observers said a shortage of electronic parts could delay deliveries."
            if kind in ELECTRONIC_SECTORS else
            "Some retailers said they would wait to see how customers react before placing large orders.",
            "Critics pointed out that an earlier product from the company was withdrawn after complaints.",
        ]))
    s.append(f"{co} expects to hire {c.rng.randrange(10, 200, 5)} new staff at its {town} site by the end of the year.")
    return "article", " ".join(s)


def p_results(c):
    co, sector, product = pick_company(c)
    up = c.chance(0.6)
    pct, rev = _pct(c), c.rng.randrange(12, 900)
    q = c.choice(["first", "second", "third", "fourth"])
    s = [f"{co} said on {c.choice(WEEKDAYS)} that its revenue {'rose' if up else 'fell'} by {pct} percent in the {q} quarter, to {rev} million dollars."]
    if up:
        s.append(c.choice([
            f"The company said strong demand for {product} was the main reason for the increase.",
            f"Much of the growth came from new customers abroad, especially in {c.pick('country')}.",
        ]))
    else:
        s.append(c.choice([
            "The company blamed higher energy costs and a slow start to the year.",
            f"It said a delay in launching {product} had hurt sales.",
        ]))
    p_then, p_now = sorted(c.rng.sample(range(1, 60), 2), reverse=not up)
    s.append(f"Profit for the period was {p_now} million dollars, compared with {p_then} million a year earlier.")
    s.append(c.choice([
        f"Chief executive {full_name(c)} described the results as \"{'encouraging' if up else 'disappointing but not surprising'}\".",
        f"In a statement, the board said it remained {'optimistic' if up else 'cautious'} about the rest of the year.",
    ]))
    s.append(c.choice([
        f"The company plans to open a new office in {c.pick('city')} next spring.",
        f"It will also spend {c.rng.randrange(2, 40)} million dollars on a new factory near {pick_town(c)}.",
        "It announced no changes to its staff numbers.",
    ]))
    s.append(f"Shares in {co.split()[0]} {'rose' if up else 'fell'} {c.rng.randint(1, 9)} percent in early trading.")
    return "article", " ".join(s)


COUNCIL_PROJECTS = [
    ("build new cycle lanes along the high street", "cyclists", "shop owners worried about losing parking spaces"),
    ("renovate the public library", "readers and students", "some residents said the money should go to road repairs"),
    ("turn an empty car park into a community garden", "families", "nearby businesses feared fewer visitors"),
    ("extend the opening hours of the swimming pool", "swimmers", "staff unions asked for extra pay for late shifts"),
    ("plant 800 trees along the river path", "walkers", "a few residents complained about falling leaves"),
    ("build a skate park next to the sports ground", "teenagers", "neighbors raised concerns about noise"),
    ("introduce free bus travel for people over 70", "older residents", "some councillors questioned the cost"),
    ("install solar panels on every school roof", "schools", "the opposition argued the plan was rushed"),
]


def p_council(c):
    town = pick_town(c)
    proj, who, objection = c.choice(COUNCIL_PROJECTS)
    yes = c.rng.randint(9, 15)
    no = c.rng.randint(2, yes - 3)
    cost = c.rng.randrange(150, 4000, 50)
    s = [f"{town} town council voted {yes} to {no} on {c.choice(WEEKDAYS)} evening to {proj}."]
    s.append(f"The project is expected to cost around {cost * 1000:,} pounds and should be finished by {c.choice(MONTHS)} next year.")
    s.append(f"Supporters said the plan would benefit {who} and make the town more attractive.")
    s.append(c.choice([f"However, {objection}.", f"Not everyone was convinced: {objection}."]))
    s.append(c.choice([
        f"Councillor {full_name(c)}, who proposed the plan, said it had been discussed at {nw(c.rng.randint(3, 9))} public meetings.",
        f"Mayor {full_name(c)} called the vote \"a good day for {town}\".",
    ]))
    if c.chance(0.6):
        s.append(f"A survey of {c.rng.randrange(200, 1500, 10):,} residents found that {c.rng.randint(52, 81)} percent supported the idea.")
    s.append(c.choice([
        "Work is due to start in the spring.",
        "The council will publish a detailed timetable next month.",
        "A final design will be shown to the public before construction begins.",
    ]))
    return "article", " ".join(s)


STUDY_FINDINGS = [
    ("honeybees visit flowers more often when the petals are slightly warmer than the air", "flower beds", "bee visits"),
    ("children who walk to school pay more attention in their first lesson", "pupils", "attention scores"),
    ("adding crushed seashells to garden soil can reduce its acidity", "soil samples", "acidity levels"),
    ("short naps of about twenty minutes improve reaction times in night-shift workers", "workers", "reaction times"),
    ("city parks with ponds are on average two degrees cooler on summer afternoons", "parks", "temperatures"),
    ("tomato plants grow taller when they are gently brushed by hand every day", "plants", "growth"),
    ("people remember shopping lists better when they say the items out loud", "volunteers", "memory scores"),
    ("sparrows in noisy streets sing at a higher pitch than sparrows in quiet villages", "birds", "song recordings"),
    ("bread stays fresh longer when it is stored with a slice of apple", "loaves", "freshness"),
    ("dogs that are walked twice a day sleep more calmly at night", "dogs", "sleep patterns"),
]
FIELDS = ["Applied Ecology", "Everyday Science", "Urban Studies", "Human Behavior", "Plant Biology", "Sleep Research"]


def p_study(c):
    finding, subjects, measure = c.choice(STUDY_FINDINGS)
    town, lead = pick_town(c), full_name(c)
    n = c.rng.randrange(40, 900, 10)
    s = [c.choice([
        f"Researchers at the University of {town} have found that {finding}.",
        f"A new study from the University of {town} suggests that {finding}.",
    ])]
    s.append(f"The team studied {n} {subjects} over {c.choice(['six weeks', 'three months', 'one year', 'two summers'])} and compared their {measure} with a control group.")
    s.append(f"The effect was small but clear, according to the lead author, {lead}.")
    s.append(c.choice([
        f"\"We were surprised by how consistent the results were,\" {lead.split()[0]} said.",
        f"\"This is a simple idea that anyone could test at home,\" {lead.split()[0]} said.",
    ]))
    s.append(c.choice([
        "The authors note that the study was relatively small and that the results need to be repeated elsewhere.",
        "Other scientists cautioned that the findings may not apply in colder climates.",
        "The researchers admit they do not yet understand why the effect happens.",
    ]))
    s.append(f"The work was published this week in the Journal of {c.choice(FIELDS)}.")
    if c.chance(0.5):
        s.append(f"A larger follow-up study involving {c.rng.randint(3, 8)} universities is planned for next year.")
    return "article", " ".join(s)


TEAM_SUFFIX = ["Rovers", "United", "Athletic", "City", "Wanderers", "Rangers", "Town", "Harriers"]


def p_sports(c):
    t1 = f"{pick_town(c)} {c.choice(TEAM_SUFFIX)}"
    t2 = f"{pick_town(c)} {c.choice(TEAM_SUFFIX)}"
    g1 = c.rng.randint(1, 4)
    g2 = c.rng.randint(0, g1 - 1)
    p1, p2 = full_name(c), full_name(c)
    m1, m2 = sorted(c.rng.sample(range(3, 89), 2))
    s = [f"{t1} beat {t2} {g1}-{g2} on {c.choice(['Saturday', 'Sunday', 'Wednesday night'])} in front of a crowd of {c.rng.randrange(800, 9000, 50):,}."]
    s.append(f"{p1} opened the scoring in the {m1}th minute with a header from a corner.")
    if g1 >= 2:
        s.append(f"{p2} added {'a second' if g1 >= 2 else 'another'} goal in the {m2}th minute after a long run down the left wing.")
    if g2 > 0:
        s.append(f"The visitors pulled {'one' if g2 == 1 else 'two'} back late in the game, but it was not enough.")
    s.append(c.choice([
        f"The win moves {t1.split()[0]} up to {c.choice(['second', 'third', 'fourth', 'fifth'])} place in the league.",
        f"It was {t1.split()[0]}'s {c.choice(['third', 'fourth', 'fifth'])} win in a row.",
    ]))
    s.append(c.choice([
        f"\"The players worked hard for each other today,\" said coach {full_name(c)}.",
        f"Coach {full_name(c)} praised the team's defending but said they must take more of their chances.",
    ]))
    s.append(f"{t2.split()[0]} have now lost {c.rng.randint(2, 5)} of their last six matches and face a difficult game next week.")
    return "match report", " ".join(s)


FESTIVALS = ["Kite", "Cheese", "Jazz", "Lantern", "Apple", "Folk Music", "Street Food", "Science",
             "Book", "Pumpkin", "Sandcastle", "Flower", "Bread", "Chili"]


def p_festival(c):
    town, kind = pick_town(c), c.choice(FESTIVALS)
    nth = c.rng.randint(2, 40)
    suffix = "th" if 10 <= nth % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(nth % 10, "th")
    s = [f"The {nth}{suffix} {town} {kind} Festival took place last weekend and attracted about {c.rng.randrange(1500, 30000, 500):,} visitors."]
    s.append(c.choice([
        f"Highlights included a parade through the old town and a competition won by a local {c.choice(['school', 'family', 'bakery', 'choir'])}.",
        "The most popular event was an evening show by the river, which ended with fireworks.",
        f"More than {c.rng.randrange(30, 150, 10)} stalls lined the main square, selling food, crafts and souvenirs.",
    ]))
    s.append(c.choice([
        "Despite a heavy shower on Saturday afternoon, most events went ahead as planned.",
        "Warm, sunny weather helped make it one of the busiest years so far.",
        "Strong winds forced organizers to move some events indoors on Sunday.",
    ]))
    s.append(f"The festival is run by {c.rng.randint(40, 300)} volunteers and raised {c.rng.randrange(2000, 40000, 500):,} pounds for local charities.")
    s.append(c.choice([
        f"Organizer {full_name(c)} said the team was \"tired but very happy\".",
        f"\"Every year it gets bigger,\" said {full_name(c)}, who has helped run the festival since it began.",
    ]))
    s.append(c.choice([
        f"Next year's festival will be held in {c.choice(MONTHS)}, and organizers hope to add a second stage.",
        "Plans for next year include a free shuttle bus from the train station.",
    ]))
    return "article", " ".join(s)


def p_storm(c):
    town = pick_town(c)
    s = [f"A storm brought heavy rain and winds of up to {c.rng.randrange(70, 140, 5)} km/h to {town} on {c.choice(WEEKDAYS)} night."]
    s.append(f"Fallen trees blocked {c.rng.randint(3, 25)} roads, and about {c.rng.randrange(300, 9000, 50):,} homes lost power for several hours.")
    s.append(c.choice([
        f"{cap(nw(c.rng.randint(2, 9)))} schools stayed closed the next morning while engineers checked the buildings.",
        "Train services between the town and the coast were suspended until midday.",
        "The river rose by more than a meter, and sandbags were handed out to residents near the bridge.",
    ]))
    s.append("No serious injuries were reported, although one person was treated for minor cuts after a window broke.")
    s.append(c.choice([
        f"Volunteers from the local {c.choice(['rugby club', 'scout group', 'fire brigade', 'sailing club'])} helped clear branches from the streets.",
        "Council workers spent most of the next day clearing debris from the town center.",
    ]))
    s.append(c.choice([
        "Forecasters expect calmer weather by the weekend, but more rain is likely next week.",
        "The weather service has warned that another storm could arrive within days.",
    ]))
    return "report", " ".join(s)


SCHOOL_BUILDS = ["a weather station on the school roof", "a solar-powered phone-charging bench",
                 "a small robot that sorts recycling", "a rainwater collection system for the school garden",
                 "an app that shows when the school buses are running late", "a greenhouse made from plastic bottles",
                 "a bird-box camera that streams to the classroom", "a machine that waters plants automatically"]


def p_school(c):
    town, thing = pick_town(c), c.choice(SCHOOL_BUILDS)
    n = c.rng.randint(4, 14)
    teacher = full_name(c)
    s = [f"A team of {nw(n)} students at {town} Secondary School has built {thing}."]
    s.append(f"The project took {nw(c.rng.randint(3, 9))} months and was mostly done during lunch breaks and after school.")
    s.append(f"The students, aged between {c.rng.randint(12, 14)} and {c.rng.randint(15, 17)}, used {c.choice(['recycled materials', 'donated parts', 'a small grant from a local company', 'money raised at a bake sale'])}.")
    s.append(c.choice([
        f"Their teacher, {teacher}, said the group had learned \"more from their mistakes than from any textbook\".",
        f"\"They solved problems I didn't know how to solve,\" said their science teacher, {teacher}.",
    ]))
    s.append(c.choice([
        f"The project won {c.choice(['first', 'second', 'third'])} prize at the regional science fair in {c.choice(MONTHS)}.",
        "The team has been invited to present its work at a national competition.",
    ]))
    s.append(c.choice([
        "Next, the students want to share their design so that other schools can build their own.",
        "The school now plans to make the project part of its regular science lessons.",
    ]))
    return "article", " ".join(s)


REVIEW_ITEMS = ["electric kettle", "pair of running shoes", "robot vacuum cleaner", "backpack",
                "coffee grinder", "desk lamp", "air fryer", "Bluetooth speaker", "camping stove",
                "office chair", "e-reader", "rice cooker"]


def p_review(c):
    brand = c.pick("company_prefix")
    model = c.pick("model_name")
    item = c.choice(REVIEW_ITEMS)
    weeks = c.rng.randint(2, 12)
    s = [f"I bought the {brand} {model} {item} about {weeks} weeks ago, and I have used it almost every day."]
    s.append(c.choice([
        "It arrived quickly and was easy to set up, even without reading the instructions.",
        "Setting it up took longer than I expected because the instructions were confusing.",
    ]))
    s.append(c.choice([
        "The build quality is excellent and it feels like it will last for years.",
        "It looks nice, but some parts feel a bit cheap.",
        "It is lighter than my old one, which I really like.",
    ]))
    s.append(c.choice([
        "My only real complaint is that it is quite noisy.",
        "The biggest problem is the short cable, so I have to use an extension lead.",
        "I wish it came in more colors, but that is a small issue.",
        "Customer service was slow to answer when I had a question.",
    ]))
    s.append(f"At {c.rng.randrange(25, 300)} dollars, it is {c.choice(['good value for money', 'a little expensive', 'cheaper than similar products'])}.")
    stars = c.rng.randint(2, 5)
    s.append(f"Overall I would give it {stars} out of 5 stars{' and recommend it to friends' if stars >= 4 else ', but I might look elsewhere next time'}.")
    return "review", " ".join(s)


def p_email(c):
    friend, me = c.sample("name", 2)
    city, days = c.pick("city"), c.rng.randint(3, 12)
    s = [f"Hi {friend},", f"We just got back from {days} days in {city} and I wanted to tell you about it."]
    s.append(c.choice([
        "The first two days were rainy, so we spent a lot of time in museums and cafés.",
        "The weather was perfect almost the whole time, so we walked everywhere.",
    ]))
    s.append(c.choice([
        "The highlight was a boat trip on our last evening, when the whole city was lit up.",
        f"The best part was a cooking class where we learned to make a local {c.pick('simple_food')}.",
        "We also took a day trip to the mountains, which was beautiful but exhausting.",
    ]))
    s.append(c.choice([
        "Unfortunately, our luggage arrived a day late, so I had to buy a few clothes.",
        "The only bad moment was when we missed our train and had to wait three hours for the next one.",
        "Our hotel was noisy, but the staff were very friendly.",
    ]))
    s.append(c.choice([
        f"Are you free on {c.choice(WEEKDAYS)}? I'd love to show you the photos over dinner.",
        "Let me know when you're back from your course, and we can meet for coffee.",
    ]))
    return "email", f"{s[0]}\n\n{' '.join(s[1:])}\n\nBest wishes,\n{me}"


def p_meeting(c):
    people = c.sample("name", 4)
    proj = c.choice(["the new website", "the spring product catalogue", "the office move",
                     "the customer survey", "the mobile app update", "the charity fun run", "the school open day"])
    day = c.choice(WEEKDAYS[:5])
    s = [f"Notes from the project meeting on {day} about {proj}.", f"Present: {join_and(people)}."]
    s.append(f"{people[0]} reported that the work is about {c.rng.randrange(30, 90, 5)} percent complete, slightly behind schedule.")
    s.append(c.choice([
        "The main problem is that the design team is waiting for final texts from the marketing team.",
        "The group agreed that testing had taken longer than planned because of a bug in the booking form.",
        "Two suppliers have not yet confirmed their delivery dates.",
    ]))
    s.append(f"It was decided to move the deadline to {c.choice(MONTHS)} {c.rng.randint(1, 28)}.")
    s.append(f"{people[1]} will contact the suppliers by {c.choice(WEEKDAYS[:5])}, and {people[2]} will prepare a short budget update.")
    s.append(c.choice([
        f"{people[3]} asked whether extra help could be hired; this will be discussed with the manager.",
        f"{people[3]} will book a room for the next meeting.",
    ]))
    s.append(f"The next meeting is planned for {c.choice(WEEKDAYS[:5])} at {c.choice([9, 10, 11, 2, 3])} o'clock.")
    return "meeting notes", " ".join(s)


BIO_FIELDS = [("painter", "landscapes of the coast", "a retrospective at the national gallery"),
              ("inventor", "a cheap water filter made from clay", "a national award for innovation"),
              ("composer", "music for children's choirs", "a lifetime achievement prize"),
              ("botanist", "rare mountain mosses", "a medal from the botanical society"),
              ("architect", "schools built from local timber", "an international design award"),
              ("chef", "simple dishes made from forgotten vegetables", "a famous cooking prize"),
              ("photographer", "portraits of fishing families", "an exhibition in three countries"),
              ("engineer", "lightweight bridges for remote villages", "an honorary doctorate")]


def p_bio(c):
    person, town = full_name(c), pick_town(c)
    role, work, honor = c.choice(BIO_FIELDS)
    born = _year(c, 1920, 1985)
    first = person.split()[0]
    s = [f"{person} was born in {town} in {born}, the {c.choice(['eldest', 'youngest', 'second'])} of {nw(c.rng.randint(2, 6))} children."]
    s.append(c.choice([
        f"As a child, {first} spent most weekends helping in the family's {c.choice(['bakery', 'boatyard', 'garden', 'bookshop', 'workshop'])}.",
        f"{first} left school at {c.rng.randint(16, 18)} and worked in a factory before studying at night.",
    ]))
    s.append(f"{first} became {a_an(role)} in {born + c.rng.randint(20, 30)} and soon became known for {work}.")
    s.append(c.choice([
        "Critics at first ignored the work, but it slowly found a loyal audience.",
        "The work was praised for being both practical and beautiful.",
    ]))
    s.append(f"In {born + c.rng.randint(35, 45)}, {first} received {honor}.")
    s.append(c.choice([
        f"Today a small museum in {town} displays some of {first}'s notebooks.",
        f"{first} still gives talks to students about following an unusual path.",
        f"Many young people in {town} say {first} inspired them to choose the same career.",
    ]))
    return "profile", " ".join(s)


RESTAURANT_KINDS = ["noodle bar", "vegetarian café", "seafood restaurant", "bakery and coffee shop",
                    "pizza place", "dumpling house", "breakfast diner", "tapas bar"]


def p_restaurant(c):
    town, kind, owner = pick_town(c), c.choice(RESTAURANT_KINDS), full_name(c)
    s = [f"A new {kind} opened on {c.choice(['Market Street', 'Harbor Road', 'the high street', 'Station Square'])} in {town} last {c.choice(WEEKDAYS)}."]
    s.append(f"It is run by {owner}, who previously worked as a cook in {c.pick('city')} for {c.rng.randint(3, 15)} years.")
    s.append(f"The menu changes every {c.choice(['week', 'month', 'season'])} and uses vegetables from farms within {c.rng.randrange(10, 60, 5)} kilometers.")
    s.append(c.choice([
        f"On the first evening, the queue stretched around the corner, and the {c.rng.randint(20, 60)} tables were full by seven o'clock.",
        "Early visitors praised the friendly service, though some said the portions were small.",
    ]))
    s.append(c.choice([
        f"\"I always dreamed of coming home to {town} and cooking for my neighbors,\" {owner.split()[0]} said.",
        f"{owner.split()[0]} says the secret is keeping the menu short and the prices fair.",
    ]))
    s.append(f"It is open from {c.choice(['Tuesday', 'Wednesday'])} to Sunday and employs {c.rng.randint(4, 18)} people.")
    return "article", " ".join(s)


WILDLIFE = ["herons", "otters", "dragonflies", "barn owls", "water voles", "kingfishers", "bats",
            "butterflies", "frogs", "swallows"]


def p_wildlife(c):
    town = pick_town(c)
    a, b = c.rng.sample(WILDLIFE, 2)
    n1, pct = c.rng.randint(12, 300), _pct(c)
    s = [f"Rangers at the {town} Nature Reserve counted {n1} {a} this spring, {pct} percent more than last year."]
    s.append(f"The increase follows a project to restore {c.choice(['two ponds', 'an old meadow', 'the riverbank', 'a strip of wetland'])} that began {nw(c.rng.randint(2, 6))} years ago.")
    s.append(f"Numbers of {b}, however, fell slightly, which rangers believe is linked to the dry summer.")
    s.append(f"More than {c.rng.randrange(20, 120, 10)} volunteers helped with the count, walking set routes at dawn and dusk.")
    s.append(c.choice([
        "Visitors are asked to keep dogs on a lead during the nesting season.",
        "The reserve will open a new bird hide near the lake in the autumn.",
        "Rangers plan to repeat the survey every spring for the next ten years.",
    ]))
    return "report", " ".join(s)


PASSAGES_TRAIN = [p_product_launch, p_results, p_council, p_study, p_sports, p_festival, p_storm,
                  p_school, p_review, p_email, p_meeting, p_bio, p_restaurant, p_wildlife]


# --- held-out passage types ----------------------------------------------------------------

EXHIBITS = ["old maps of the coastline", "toys from the last two centuries", "clocks and watches",
            "photographs of the town's first factories", "costumes from local theater productions"]


def p_ho_museum(c):
    town, curator = pick_town(c), full_name(c)
    s = [f"The {town} Museum will open a new exhibition of {c.choice(EXHIBITS)} on {c.choice(MONTHS)} {c.rng.randint(1, 28)}."]
    s.append(f"The collection includes about {c.rng.randrange(80, 600, 10)} objects, many of which have never been shown in public before.")
    s.append(f"Most of them were donated by local families over the past {c.rng.randint(10, 40)} years.")
    s.append(f"Curator {curator} said the team spent {c.choice(['a year', 'eighteen months', 'two years'])} cleaning and labeling every item.")
    s.append("Visitors will also be able to try a hands-on workshop on weekends.")
    s.append(f"Entry costs {c.rng.randint(4, 12)} pounds for adults and is free for children under {c.choice([12, 14, 16])}.")
    return "article", " ".join(s)


def p_ho_ferry(c):
    town, other = pick_town(c), pick_town(c)
    s = [f"From {c.choice(MONTHS)}, the ferry between {town} and {other} will run {c.choice(['every 40 minutes', 'every hour', 'twice an hour'])} instead of {c.choice(['four', 'five', 'six'])} times a day."]
    s.append(f"The change is possible because the operator has bought a second, larger boat that can carry {c.rng.randrange(120, 400, 10)} passengers and {c.rng.randint(20, 60)} cars.")
    s.append("Ticket prices will stay the same for the rest of the year.")
    s.append(c.choice(["Local businesses welcomed the news, saying it would bring more day visitors.",
                       "Island residents had campaigned for a better service for more than a decade."]))
    s.append(f"However, the last crossing of the day will leave {c.choice(['half an hour', 'an hour'])} earlier than before, which some commuters have criticized.")
    s.append("The new timetable is available at the harbor office and online.")
    return "notice", " ".join(s)


def p_ho_dig(c):
    town, lead = pick_town(c), full_name(c)
    find = c.choice(["the remains of a wooden boat", "a hoard of silver coins", "the foundations of a medieval mill",
                     "a collection of clay pots", "a stone well"])
    s = [f"Archaeologists digging near {town} have uncovered {find} that may be more than {c.rng.randrange(600, 2000, 100):,} years old."]
    s.append(f"The discovery was made by {c.choice(['a student volunteer', 'a farmer plowing a field', 'a team surveying for a new road'])} in {c.choice(MONTHS)}.")
    s.append(f"Dig leader {lead} said the site is unusually well preserved because it was covered by wet clay.")
    s.append("Samples have been sent to a laboratory to confirm their age.")
    s.append(f"The team hopes to continue digging for another {nw(c.rng.randint(2, 8))} weeks before the land is returned to farming.")
    s.append("Some of the finds will later be shown at the regional museum.")
    return "article", " ".join(s)


def p_ho_charity(c):
    town, org = pick_town(c), full_name(c)
    feat = c.choice(["swam across the bay", "cycled 300 kilometers in three days", "baked 2,000 cupcakes",
                     "walked the entire coastal path", "played piano for 24 hours without stopping"])
    s = [f"A group of friends from {town} {feat} to raise money for the local children's hospital."]
    s.append(f"They hoped to collect {c.rng.randrange(2000, 10000, 500):,} pounds but ended up with more than {c.rng.randrange(11000, 40000, 500):,}.")
    s.append(f"The idea came from {org}, whose {c.choice(['daughter', 'son', 'nephew', 'niece'])} spent several weeks at the hospital last year.")
    s.append("Hundreds of people followed their progress online and cheered them on at the finish.")
    s.append("The money will be used to buy new equipment for the children's ward and to redecorate the family room.")
    return "article", " ".join(s)


def p_ho_footbridge(c):
    town, eng = pick_town(c), full_name(c)
    weeks = c.rng.randint(3, 14)
    s = [f"The footbridge over the railway in {town} will close for {nw(weeks) if weeks <= 12 else weeks} weeks from {c.choice(MONTHS)} {c.rng.randint(1, 28)} so that engineers can replace its rusted steel beams."]
    s.append(c.choice([
        f"During the work, pedestrians will have to use a detour of about {c.rng.randrange(400, 1500, 100)} meters via the level crossing.",
        "A free minibus will carry people with wheelchairs, prams and heavy bags across the tracks every twenty minutes.",
    ]))
    s.append(f"The bridge was built in {c.rng.randint(1890, 1960)} and is used by roughly {c.rng.randrange(900, 6000, 100):,} people a day, many of them school children.")
    s.append(c.choice([
        f"Project engineer {eng} said the bridge is safe to use until the closure, but the repairs cannot wait another winter.",
        f"According to {eng}, who is leading the project, the new beams should last at least sixty years.",
    ]))
    s.append(c.choice([
        "Some parents have asked for extra crossing guards near the primary school while the bridge is shut.",
        "Shopkeepers on the far side of the tracks fear that fewer customers will make the longer walk.",
    ]))
    s.append("Updates will be posted on notice boards at both ends of the bridge.")
    return "notice", " ".join(s)


def p_ho_tool_library(c):
    town, who = pick_town(c), full_name(c)
    n_tools = c.rng.randrange(120, 700, 10)
    s = [f"The public library in {town} has started lending out tools as well as books."]
    s.append(f"Members can now borrow items such as {c.choice(['drills, ladders and sewing machines', 'tents, camping stoves and sleeping bags', 'pressure washers, hedge trimmers and wheelbarrows', 'bread makers, ice cream machines and large cooking pots'])} for up to {nw(c.choice([7, 10, 14]))} days.")
    s.append(f"The collection of about {n_tools} items was built up from donations and a small grant from the town council.")
    s.append(c.choice([
        f"Librarian {who} said the idea was to save people money and stop them buying things they only use once a year.",
        f"\"Most drills are used for about thirteen minutes in their whole life,\" said librarian {who}.",
    ]))
    s.append(f"In the first {c.choice(['month', 'six weeks', 'two months'])}, items were borrowed more than {c.rng.randrange(200, 1400, 10)} times.")
    s.append(c.choice([
        "Volunteers check and clean every tool when it is returned.",
        "Borrowers are asked to pay a small fee if an item comes back damaged.",
    ]))
    return "article", " ".join(s)


def p_ho_job_ad(c):
    co, sector, product = pick_company(c)
    town = pick_town(c)
    role = c.choice(["part-time receptionist", "warehouse assistant", "junior bookkeeper", "delivery driver",
                     "customer support adviser", "shop assistant"])
    s = [f"{co}, a growing {sector} company in {town}, is looking for {a_an(role)} to join its team."]
    s.append(f"The role is {c.choice(['twenty', 'twenty-five', 'thirty', 'thirty-seven'])} hours a week, with some flexibility around school hours.")
    s.append(c.choice([
        "No previous experience is needed, as full training will be provided.",
        "At least one year of experience in a similar role is preferred but not essential.",
    ]))
    s.append(c.choice([
        "The ideal candidate is friendly, organized and comfortable using a computer.",
        "We are looking for someone reliable who enjoys working with people and solving problems.",
    ]))
    s.append(f"The pay is {c.rng.randint(12, 19)} pounds per hour, and staff receive a discount on {product}.")
    s.append(f"To apply, send a short letter and your CV by {c.choice(MONTHS)} {c.rng.randint(1, 28)}. Interviews will take place the following week.")
    return "job advert", " ".join(s)


def p_ho_complaint(c):
    me, item, co = full_name(c), c.pick("shop_item"), pick_company(c)[0]
    days = c.rng.randint(9, 30)
    s = ["Dear Customer Service,", f"I am writing about my order for a {item}, which I placed on your website {days} days ago."]
    s.append(f"The confirmation email promised delivery within {nw(c.choice([3, 5, 7]))} working days, but the parcel still has not arrived.")
    s.append(c.choice([
        f"I have called your helpline {nw(c.rng.randint(2, 5))} times, and each time I was told it would arrive the next day.",
        "The tracking page has shown the same message, \"in transit\", for more than a week.",
    ]))
    s.append(c.choice([
        "The item was meant to be a birthday present, and the birthday has now passed.",
        "I paid extra for faster delivery, so this is especially disappointing.",
    ]))
    s.append(c.choice([
        "Please either deliver the item within three days or give me a full refund.",
        "I would like a refund of the delivery charge and a firm date for delivery.",
    ]))
    return "letter", f"{s[0]}\n\n{' '.join(s[1:])}\n\nYours sincerely,\n{me}"


def p_ho_orchard(c):
    town = pick_town(c)
    kg = c.rng.randrange(300, 4000, 50)
    s = [f"Volunteers at the community orchard in {town} picked a record {kg:,} kilograms of {c.choice(['apples', 'pears', 'plums', 'apples and pears'])} this autumn."]
    s.append(f"The orchard was planted on an unused school field {nw(c.rng.randint(5, 12))} years ago and now has more than {c.rng.randrange(60, 300, 10)} trees.")
    s.append(c.choice([
        "Most of the fruit was pressed into juice and sold at the weekly market.",
        "Much of the harvest went to food banks and school kitchens in the area.",
    ]))
    s.append(c.choice([
        "Organizers said the mild spring, with no late frost, was the main reason for the large crop.",
        "Organizers credited the beehives that were added to the orchard two years ago.",
    ]))
    s.append(f"A harvest party with music and apple games will be held on the first {c.choice(['Saturday', 'Sunday'])} of next month, and everyone is welcome.")
    return "article", " ".join(s)


PASSAGES_HELDOUT = [p_ho_museum, p_ho_ferry, p_ho_dig, p_ho_charity, p_ho_footbridge, p_ho_tool_library,
                    p_ho_job_ad, p_ho_complaint, p_ho_orchard]


def passage(c, max_words: int = PASSAGE_WORDS[1]) -> tuple[str, str]:
    gens = PASSAGES_HELDOUT if c.split == "heldout" else PASSAGES_TRAIN
    for _ in range(50):
        doc, text = c.choice(gens)(c)
        n = len(text.split())
        if PASSAGE_WORDS[0] <= n <= max_words:
            return doc, text
    raise RuntimeError("could not build a passage of the right length")


SUMMARIZE_TRAIN = [
    "Summarize the following {doc} in one sentence.\n\n{p}",
    "{p}\n\nSummarize the text above in two sentences.",
    "Write a short summary of this {doc}:\n\n{p}",
    "{p}\n\nTL;DR:",
    "Summarize the key points of this {doc} as three bullet points.\n\n{p}",
    "Read the {doc} below and write a one-line headline for it.\n\n{p}",
    "{p}\n\nExplain the main point of this {doc} to a ten-year-old.",
    "Give a brief summary (under 40 words) of the following {doc}:\n\n{p}",
    "Here is {doc_a}:\n\n{p}\n\nWhat are the most important facts? Summarize them briefly.",
    "Condense this {doc} into a short paragraph:\n\n{p}",
    "{p}\n\nWhat is this {doc} mainly about? Answer in one or two sentences.",
    "Summarize the {doc} below for a busy reader.\n\"\"\"\n{p}\n\"\"\"",
    "Please summarize:\n{p}",
    "Write a summary of the following text, then list the numbers it mentions.\n\n{p}",
    "{p}\n\nIn your own words, summarize what this {doc} says.",
    "Text: {p}\n\nSummary:",
    "Summarize this {doc} as a social media post of at most two sentences:\n\n{p}",
]
SUMMARIZE_HELDOUT = [
    "Produce a concise abstract of the following {doc}.\n\n{p}",
    "{p}\n\nBoil this down to its single most important sentence.",
    "Someone asks you what this {doc} says. Give them a quick summary.\n\n{p}",
    "Passage:\n{p}\n\nWrite a brief summary in plain English.",
]


def _summ(tmpl: str):
    def fn(c):
        doc, p = passage(c)
        return [tmpl.format(doc=doc, doc_a=a_an(doc), p=p)]
    fn.__name__ = f"summarization:{tmpl[:40]}"
    return fn


for _t in SUMMARIZE_TRAIN:
    TEMPLATES["summarization"]["train"].append(_summ(_t))
for _t in SUMMARIZE_HELDOUT:
    TEMPLATES["summarization"]["heldout"].append(_summ(_t))


@template("summarization")
def summ_digest(c):
    """Two short items in one prompt: longer inputs (150-200 words)."""
    for _ in range(50):
        (d1, p1), (d2, p2) = passage(c, 110), passage(c, 110)
        if d1 != d2 or p1 != p2:
            total = len(p1.split()) + len(p2.split())
            if total <= PASSAGE_WORDS[1]:
                break
    return [c.choice([
        f"Here are two short texts.\n\n1. {p1}\n\n2. {p2}\n\nSummarize each of them in one sentence.",
        f"Text A:\n{p1}\n\nText B:\n{p2}\n\nWrite a one-sentence summary of each text, then say what, if anything, they have in common.",
    ])]


@template("summarization", heldout=True)
def summ_ho_digest(c):
    for _ in range(50):
        (_, p1), (_, p2) = passage(c, 110), passage(c, 110)
        if p1 != p2 and len(p1.split()) + len(p2.split()) <= PASSAGE_WORDS[1]:
            break
    return [f"First item:\n{p1}\n\nSecond item:\n{p2}\n\nGive a headline and a one-sentence summary for each item."]


# ======================================== rag =============================================
# An entity is a dict: name, intro sentence, facts {key: sentence}, questions {key: [..]},
# and numbers {key: value} for comparison questions.

RIVERS = ["Wend", "Alder", "Tamsin", "Lune", "Corran", "Mere", "Sill", "Brant", "Ouse", "Fennick", "Rill", "Yarrow"]
INDUSTRIES = ["fishing", "pottery", "tourism", "wool weaving", "boatbuilding", "cheese-making",
              "glassmaking", "fruit farming", "printing", "furniture making"]
SPECIES_ADJ = ["marsh-striped", "silver-crested", "copper-tailed", "pale-winged", "spotted", "dusky",
               "amber-eyed", "ridge-backed", "long-eared", "blue-throated", "speckled", "ash-gray"]
SPECIES_KIND = {"vole": ("seeds and roots", 12, 3), "warbler": ("small insects", 13, 5),
                "gecko": ("crickets and moths", 15, 8), "beetle": ("rotting wood", 3, 1),
                "frog": ("flies and worms", 6, 7), "moth": ("flower nectar", 4, 1),
                "finch": ("seeds", 14, 6), "shrew": ("earthworms and snails", 9, 2),
                "salamander": ("insect larvae", 16, 12), "dragonfly": ("midges and mosquitoes", 7, 1)}
HABITATS = ["reed beds", "pine forests", "chalk grasslands", "mountain streams", "coastal dunes",
            "old orchards", "peat bogs", "river meadows"]
GADGETS = ["e-reader", "smartwatch", "tablet", "camera drone", "robot vacuum", "electric toothbrush",
           "fitness tracker", "portable speaker", "handheld game console", "dashcam"]
BOOK_ADJ = ["Quiet", "Silver", "Last", "Hidden", "Salt", "Winter", "Paper", "Borrowed", "Crooked", "Lantern"]
BOOK_NOUN = ["Harbor", "Orchard", "Clockmaker", "Island", "Letters", "Bridge", "Garden", "Tide", "Mapmaker", "Field"]
WRITER_ROLES = ["novelist", "poet", "historian", "children's author", "science writer", "playwright"]
EVENT_KINDS = ["Kite Festival", "Jazz Weekend", "Food Fair", "Science Week", "Book Festival",
               "Lantern Parade", "Marathon", "Film Festival", "Folk Music Festival", "Craft Fair"]


def e_company(c, name: str | None = None, sector: str | None = None, product: str | None = None):
    if name is None:
        name, sector, product = pick_company(c)
    town, founded, founder, ceo = pick_town(c), _year(c, 1960, 2019), full_name(c), full_name(c)
    staff = c.rng.randrange(25, 6000, 5)
    since = c.rng.randint(max(founded + 1, 2005), 2023)
    return {
        "name": name, "intro": [f"{name} is {a_an(sector)} company.", f"{name} is a firm in the {sector} business."],
        "facts": {
            "founded": f"It was founded in {founded} by {founder}.",
            "town": f"The company is headquartered in {town}.",
            "product": f"Its best-known product is {product}.",
            "ceo": f"Since {since}, it has been led by chief executive {ceo}.",
            "staff": [f"It employs around {staff:,} people.", f"The firm has about {staff:,} employees."],
        },
        "questions": {
            "founded": [f"In which year was {name} founded?", f"Who founded {name}, and when?"],
            "town": [f"Where is {name} headquartered?", f"In which town is {name} based?"],
            "product": [f"What is {name}'s best-known product?", f"What does {name} make?"],
            "ceo": [f"Who is the chief executive of {name}?", f"Who runs {name}?"],
            "staff": [f"How many people does {name} employ?", f"How big is {name}'s workforce?"],
        },
        "numbers": {"founded": founded, "staff": staff}, "kind": "company",
        "compare": {"founded": "Which company is older, {a} or {b}?", "staff": "Which company has more employees, {a} or {b}?"},
    }


def e_town(c):
    town, river, mayor = pick_town(c), c.choice(RIVERS), full_name(c)
    pop = c.rng.randrange(1200, 95000, 100)
    industry, twin = c.choice(INDUSTRIES), c.pick("city")
    century = c.choice(["11th", "12th", "13th", "14th", "15th", "16th", "17th"])
    return {
        "name": town, "intro": [f"{town} is a market town founded in the {century} century.",
                                f"{town} is a small town whose oldest buildings date from the {century} century."],
        "facts": {
            "pop": f"It has a population of about {pop:,}.",
            "river": [f"The River {river} runs through the town center.", f"The town lies on the River {river}."],
            "mayor": f"The current mayor is {mayor}.",
            "industry": f"The town grew rich from {industry}, which is still its main industry.",
            "twin": f"{town} has been twinned with {twin} since {c.rng.randint(1955, 2010)}.",
        },
        "questions": {
            "pop": [f"How many people live in {town}?", f"What is the population of {town}?"],
            "river": [f"Which river flows through {town}?"],
            "mayor": [f"Who is the mayor of {town}?"],
            "industry": [f"What is the main industry in {town}?"],
            "twin": [f"Which city is {town} twinned with?"],
        },
        "numbers": {"pop": pop}, "kind": "town",
        "compare": {"pop": "Which town has more inhabitants, {a} or {b}?"},
    }


def e_species(c):
    kind = c.choice(list(SPECIES_KIND))
    diet, length, life = SPECIES_KIND[kind]
    name = f"{c.choice(SPECIES_ADJ)} {kind}"
    length = max(1, length + c.rng.randint(-2, 3))
    life = max(1, life + c.rng.randint(0, 3))
    habitat, town = c.choice(HABITATS), pick_town(c)
    who, year = full_name(c), _year(c, 1850, 2015)
    return {
        "name": f"the {name}", "intro": f"The {name} is a small {kind}.",
        "facts": {
            "habitat": f"It lives mainly in the {habitat} around {town}.",
            "length": f"Adults are about {length} centimeters long.",
            "diet": f"It feeds on {diet}.",
            "life": f"In the wild it lives for up to {life} year{'s' if life > 1 else ''}.",
            "described": f"The species was first described in {year} by the naturalist {who}.",
        },
        "questions": {
            "habitat": [f"Where does the {name} live?"],
            "length": [f"How long is an adult {name}?"],
            "diet": [f"What does the {name} eat?"],
            "life": [f"How long can the {name} live in the wild?"],
            "described": [f"Who first described the {name}, and in which year?"],
        },
        "numbers": {"length": length, "described": year}, "kind": "species",
        "compare": {"length": "Which animal is longer, the {a} or the {b}?"},
    }


GADGET_MAKER_SUFFIX = ["Electronics", "Devices", "Digital", "Tech"]


def gadget_maker(c) -> str:
    return f"{c.pick('company_prefix')} {c.choice(GADGET_MAKER_SUFFIX)}"


def e_product(c, maker: str | None = None, gadget: str | None = None, model: str | None = None):
    maker = maker or gadget_maker(c)
    gadget = gadget or c.choice(GADGETS)
    model = model or f"{c.pick('model_name')} {c.rng.randint(2, 9)}"
    price, battery = c.rng.randrange(39, 899, 10), c.rng.randint(6, 72)
    weight, year = c.rng.randrange(90, 1500, 5), c.rng.randint(2015, 2024)
    return {
        "name": f"the {model}", "intro": f"The {model} is {a_an(gadget)} made by {maker}.",
        "facts": {
            "price": f"It costs {price} dollars.",
            "battery": [f"Its battery lasts about {battery} hours on a single charge.",
                        f"A full charge gives roughly {battery} hours of use."],
            "weight": f"It weighs {weight:,} grams.",
            "year": f"It went on sale in {year}.",
        },
        "questions": {
            "price": [f"How much does the {model} cost?"],
            "battery": [f"How long does the {model}'s battery last?"],
            "weight": [f"How heavy is the {model}?"],
            "year": [f"When did the {model} go on sale?"],
            "maker": [f"Which company makes the {model}?"],
        },
        "numbers": {"price": price, "battery": battery}, "kind": "product", "maker": maker, "model": model,
        "compare": {"price": "Which is cheaper, the {a} or the {b}?", "battery": "Which has the longer battery life, the {a} or the {b}?"},
    }


def e_person(c):
    person = full_name(c)
    role, born, town = c.choice(WRITER_ROLES), _year(c, 1930, 1992), pick_town(c)
    book = f"The {c.choice(BOOK_ADJ)} {c.choice(BOOK_NOUN)}"
    prize_year = min(born + c.rng.randint(30, 45), 2023)
    home = c.pick("city")
    return {
        "name": person, "intro": f"{person} is {a_an(role)}.",
        "facts": {
            "born": f"{person.split()[0]} was born in {town} in {born}.",
            "book": f"Their best-known work is \"{book}\".",
            "prize": f"In {prize_year}, {person.split()[0]} won the {pick_town(c)} Prize for Writing.",
            "home": f"They now live in {home}.",
        },
        "questions": {
            "born": [f"When and where was {person} born?", f"In which year was {person} born?"],
            "book": [f"What is {person}'s best-known work?"],
            "prize": [f"Which prize did {person} win, and in which year?"],
            "home": [f"Where does {person} live now?"],
        },
        "numbers": {"born": born}, "kind": "person",
        "compare": {"born": "Who was born first, {a} or {b}?"},
    }


def e_event(c, town: str | None = None):
    town = town or pick_town(c)
    name = f"{town} {c.choice(EVENT_KINDS)}"
    month, start = c.choice(MONTHS), _year(c, 1970, 2018)
    visitors, price = c.rng.randrange(800, 60000, 100), c.rng.randint(0, 45)
    return {
        "name": f"the {name}", "intro": f"The {name} takes place every {month}.",
        "facts": {
            "start": f"It was first held in {start}.",
            "visitors": [f"Last year it attracted about {visitors:,} visitors.", f"Around {visitors:,} people came last year."],
            "price": "Entry is free." if price == 0 else f"A day ticket costs {price} pounds.",
            "org": f"It is organized by a team led by {full_name(c)}.",
        },
        "questions": {
            "month": [f"In which month is the {name} held?"],
            "start": [f"When was the {name} first held?"],
            "visitors": [f"How many visitors did the {name} have last year?"],
            "price": [f"How much does it cost to attend the {name}?"],
            "org": [f"Who leads the team that organizes the {name}?"],
        },
        "numbers": {"visitors": visitors, "start": start}, "kind": "event", "town": town,
        "compare": {"visitors": "Which event attracted more visitors last year, the {a} or the {b}?"},
    }


ENTITIES_TRAIN = [e_company, e_town, e_species, e_product, e_person, e_event]

LAKE_NAMES = ["Orrin", "Vessa", "Tullen", "Marrow", "Ysolde", "Callow", "Brindle", "Heddon"]
MISSION_NAMES = ["Halden", "Perrin", "Osprey", "Veltra", "Corvid", "Lantana"]
MISSION_TARGETS = ["a small comet", "the Moon's south pole", "a near-Earth asteroid", "the clouds of Venus"]
SHIP_NAMES = ["Morning Gull", "Northern Pearl", "Saltmarsh Queen", "Evening Star", "Old Bess", "Westerly"]


def e_ho_lake(c):
    name = f"Lake {c.choice(LAKE_NAMES)}"
    area, depth = c.rng.randint(3, 90), c.rng.randrange(12, 180, 2)
    town = pick_town(c)
    fish = c.choice(["trout", "perch", "pike", "char"])
    return {
        "name": name, "intro": [f"{name} lies in a valley north of {town}.", f"{name} is a glacial lake close to {town}."],
        "facts": {"area": [f"It covers about {area} square kilometers.", f"Its surface area is roughly {area} km²."],
                  "depth": [f"Its deepest point is {depth} meters.", f"At its deepest, the water is {depth} meters deep."],
                  "fish": [f"The lake is known for its {fish}, which attract anglers every summer.",
                           f"Anglers come mainly for the {fish}."]},
        "questions": {"area": [f"How large is {name}?"], "depth": [f"How deep is {name} at its deepest point?"],
                      "fish": [f"What fish is {name} known for?"]},
        "numbers": {"depth": depth, "area": area}, "kind": "lake",
        "compare": {"depth": "Which lake is deeper, {a} or {b}?"},
    }


def e_ho_mission(c):
    name = f"{c.choice(MISSION_NAMES)}-{c.rng.randint(1, 5)}"
    year, target = c.rng.randint(2031, 2045), c.choice(MISSION_TARGETS)
    months = c.rng.randint(6, 40)
    return {
        "name": name, "intro": f"{name} is an uncrewed space probe.",
        "facts": {"year": f"It is scheduled to launch in {year}.", "target": f"Its destination is {target}.",
                  "months": f"The journey is expected to take {months} months."},
        "questions": {"year": [f"When is the {name} probe due to launch?"], "target": [f"Where is {name} going?"],
                      "months": [f"How long will the {name} journey take?"]},
        "numbers": {"months": months}, "kind": "mission",
        "compare": {"months": "Which probe has the longer journey, {a} or {b}?"},
    }


def e_ho_ship(c):
    name = c.choice(SHIP_NAMES)
    built, length, pax = c.rng.randint(1950, 2020), c.rng.randrange(30, 140, 2), c.rng.randrange(80, 900, 10)
    town = pick_town(c)
    return {
        "name": f"the {name}", "intro": f"The {name} is a passenger ferry built in {town}.",
        "facts": {"built": f"It was launched in {built}.", "length": f"The ship is {length} meters long.",
                  "pax": f"It can carry up to {pax} passengers."},
        "questions": {"built": [f"When was the {name} launched?"], "length": [f"How long is the {name}?"],
                      "pax": [f"How many passengers can the {name} carry?"]},
        "numbers": {"pax": pax, "built": built}, "kind": "ship",
        "compare": {"pax": "Which ferry can carry more passengers, the {a} or the {b}?"},
    }


SCHOOL_SUBJECTS = ["music", "marine science", "woodwork", "languages", "robotics", "theater"]
PEAK_NAMES = ["Mount Carrick", "Skellan Peak", "Mount Averly", "Hobb's Crag", "Mount Tolland", "Greywater Fell"]
CHOIRS = ["Harbor Lights Choir", "Riverside Voices", "Old Mill Singers", "Lanternfield Chorus", "Copper Bell Choir"]


def e_ho_school(c):
    town = pick_town(c)
    name = f"{town} Academy"
    founded, pupils, head = c.rng.randint(1880, 2005), c.rng.randrange(180, 1600, 10), full_name(c)
    subj = c.choice(SCHOOL_SUBJECTS)
    return {
        "name": name, "intro": [f"{name} is a secondary school on the edge of {town}.", f"{name} is a state school in {town}."],
        "facts": {"founded": f"It opened in {founded}.", "pupils": f"About {pupils:,} pupils attend the school.",
                  "head": f"The head teacher is {head}.", "subj": f"The school is best known for its {subj} department."},
        "questions": {"founded": [f"When did {name} open?"], "pupils": [f"How many pupils attend {name}?"],
                      "head": [f"Who is the head teacher of {name}?"], "subj": [f"What is {name} best known for?"]},
        "numbers": {"pupils": pupils, "founded": founded}, "kind": "school",
        "compare": {"pupils": "Which school has more pupils, {a} or {b}?"},
    }


def e_ho_peak(c):
    name, town = c.choice(PEAK_NAMES), pick_town(c)
    height, hours = c.rng.randrange(600, 3400, 10), c.rng.randint(2, 9)
    return {
        "name": name, "intro": f"{name} is a mountain that overlooks {town}.",
        "facts": {"height": f"Its summit is {height:,} meters above sea level.",
                  "hours": f"The usual walking route to the top takes about {nw(hours)} hours.",
                  "first": f"The first recorded ascent was in {c.rng.randint(1780, 1920)}."},
        "questions": {"height": [f"How high is {name}?"], "hours": [f"How long does it take to walk up {name}?"],
                      "first": [f"When was {name} first climbed?"]},
        "numbers": {"height": height}, "kind": "peak",
        "compare": {"height": "Which mountain is higher, {a} or {b}?"},
    }


def e_ho_choir(c):
    name, town, leader = c.choice(CHOIRS), pick_town(c), full_name(c)
    members, since = c.rng.randint(14, 90), c.rng.randint(1965, 2018)
    return {
        "name": f"the {name}", "intro": f"The {name} is an amateur choir from {town}.",
        "facts": {"members": f"It has {members} singers.", "since": f"It was formed in {since}.",
                  "leader": f"Its conductor is {leader}.",
                  "rehearse": f"Rehearsals take place every {c.choice(WEEKDAYS[:5])} evening in the town hall."},
        "questions": {"members": [f"How many singers are in the {name}?"], "since": [f"When was the {name} formed?"],
                      "leader": [f"Who conducts the {name}?"], "rehearse": [f"When does the {name} rehearse?"]},
        "numbers": {"members": members}, "kind": "choir",
        "compare": {"members": "Which choir has more singers, the {a} or the {b}?"},
    }


ENTITIES_HELDOUT = [e_ho_lake, e_ho_mission, e_ho_ship, e_ho_school, e_ho_peak, e_ho_choir]


def render_doc(c, ent: dict, must: list[str]) -> str:
    """Intro + the required facts + 1-3 others.  Intro/fact values may be lists of phrasings."""
    keys = [k for k in ent["facts"] if k not in must]
    extra = c.rng.sample(keys, min(len(keys), c.rng.randint(1, 3)))
    chosen = [k for k in ent["facts"] if k in must or k in extra]  # keep natural order
    pick = lambda v: c.choice(v) if isinstance(v, list) else v
    return " ".join([pick(ent["intro"])] + [pick(ent["facts"][k]) for k in chosen])


DOC_STYLES_TRAIN = ["Document {i}: {t}", "[{i}] {t}", "Doc {i} - {t}", "Source {i}:\n{t}", "({i}) {t}"]
DOC_STYLES_HELDOUT = ["Passage {i}: {t}", "#{i} {t}"]

RAG_FRAMES_TRAIN = [
    "Answer the question using the documents below.\n\n{docs}\n\nQuestion: {q}",
    "{docs}\n\nBased only on the documents above, answer this question: {q}",
    "Read these documents and answer the question.\n\n{docs}\n\nQ: {q}\nA:",
    "Context:\n{docs}\n\nQuestion: {q}\nAnswer briefly.",
    "You are given some search results.\n\n{docs}\n\nUsing them, answer: {q} Mention which document you used.",
    "Use the information in the documents to answer.\n\n{docs}\n\n{q}",
    "Here are {n} short documents.\n\n{docs}\n\nQuestion: {q}\nIf the documents do not contain the answer, say so.",
    "Question: {q}\n\nAnswer using only these sources:\n\n{docs}",
    "I found these notes:\n\n{docs}\n\nCan you tell me: {q}",
    "Documents:\n{docs}\n\nAnswer the following in one sentence: {q}",
    "Reference material:\n{docs}\n\nAnswer the question below and quote the sentence that supports your answer.\nQuestion: {q}",
    "Given the documents below, answer the question. Do not use outside knowledge.\n\n{docs}\n\nQuestion: {q}",
    "{docs}\n\nQ: {q}",
    "Read the following passages carefully.\n\n{docs}\n\nNow answer: {q}",
    "Search results:\n{docs}\n\nUser question: {q}\nWrite a short, helpful answer based on the search results.",
]
RAG_FRAMES_HELDOUT = [
    "Consult the passages and respond to the question.\n\n{docs}\n\nQuestion: {q}",
    "{docs}\n\nAnswer the question \"{q}\" and say which passage or passages you used.",
    "Knowledge base:\n{docs}\n\nQuery: {q}\nResponse:",
    "Below are some reference passages, followed by a question.\n\n{docs}\n\nQuestion: {q}\nKeep your answer to one or two sentences.",
    "Please answer {q_quoted} using nothing but the following material.\n\n{docs}",
]


def _rag_entities(c, n: int) -> list[dict]:
    gens = ENTITIES_HELDOUT if c.split == "heldout" else ENTITIES_TRAIN
    return [c.choice(gens)(c) for _ in range(n)]


def rag_question(c) -> tuple[list[str], str]:
    """Return (documents, question)."""
    gens = ENTITIES_HELDOUT if c.split == "heldout" else ENTITIES_TRAIN
    mode = c.rng.random()
    if mode < 0.2:                                   # comparison across two documents
        g = c.choice(gens)
        a, b = g(c), g(c)
        key = c.choice(list(a["compare"]))
        if a["name"] == b["name"] or a["numbers"][key] == b["numbers"][key]:
            return rag_question(c)
        docs = [render_doc(c, a, [key]), render_doc(c, b, [key])]
        if c.chance(0.4):
            docs.append(render_doc(c, _rag_entities(c, 1)[0], []))
        strip = lambda s: s[4:] if s.startswith("the ") else s
        q = a["compare"][key].format(a=strip(a["name"]), b=strip(b["name"]))
    elif mode < 0.32 and c.split == "train":         # bridge: product -> company
        gadget, model = c.choice(GADGETS), f"{c.pick('model_name')} {c.rng.randint(2, 9)}"
        co = e_company(c, name=gadget_maker(c), sector="consumer electronics",
                       product=f"the {model} {gadget}")
        prod = e_product(c, maker=co["name"], gadget=gadget, model=model)
        key = c.choice(["town", "ceo", "founded"])
        q = {"town": f"In which town is the company that makes the {prod['model']} based?",
             "ceo": f"Who is the chief executive of the company that makes the {prod['model']}?",
             "founded": f"When was the maker of the {prod['model']} founded?"}[key]
        docs = [render_doc(c, prod, []), render_doc(c, co, [key])]
        if c.chance(0.5):
            docs.append(render_doc(c, _rag_entities(c, 1)[0], []))
    elif mode < 0.4 and c.split == "train":          # bridge: event -> town
        town = e_town(c)
        ev = e_event(c, town=town["name"])
        key = c.choice(["pop", "river", "mayor", "industry"])
        q = {"pop": f"What is the population of the town that hosts the {ev['name'][4:]}?",
             "river": f"Which river runs through the town where the {ev['name'][4:]} takes place?",
             "mayor": f"Who is the mayor of the town that hosts the {ev['name'][4:]}?",
             "industry": f"What is the main industry of the town where the {ev['name'][4:]} is held?"}[key]
        docs = [render_doc(c, ev, []), render_doc(c, town, [key])]
    else:                                            # single-document fact + distractors
        ents = _rag_entities(c, c.choice([2, 3]))
        if len({e["name"] for e in ents}) < len(ents):
            return rag_question(c)
        target = ents[0]
        key = c.choice(list(target["questions"]))
        q = c.choice(target["questions"][key])
        docs = [render_doc(c, target, [] if key in ("maker", "month") else [key])]
        docs += [render_doc(c, e, []) for e in ents[1:]]
    c.rng.shuffle(docs)
    return docs, q


def _rag(frame: str):
    def fn(c):
        for _ in range(50):
            docs, q = rag_question(c)
            if PASSAGE_WORDS[0] <= sum(len(d.split()) for d in docs) <= PASSAGE_WORDS[1]:
                break
        else:
            raise RuntimeError("could not build rag documents of the right length")
        styles = DOC_STYLES_HELDOUT if c.split == "heldout" else DOC_STYLES_TRAIN
        style = c.choice(styles)
        text = "\n\n".join(style.format(i=i + 1, t=d) for i, d in enumerate(docs))
        return [frame.format(docs=text, q=q, n=len(docs), q_quoted=f'"{q}"')]
    fn.__name__ = f"rag:{frame[:40]}"
    return fn


for _t in RAG_FRAMES_TRAIN:
    TEMPLATES["rag"]["train"].append(_rag(_t))
for _t in RAG_FRAMES_HELDOUT:
    TEMPLATES["rag"]["heldout"].append(_rag(_t))


# ================================== math_reasoning ========================================

pool("math_item", [
    ("notebook", "notebooks", 2, 6), ("pen", "pens", 1, 3), ("comic book", "comic books", 3, 9),
    ("sandwich", "sandwiches", 4, 8), ("bag of rice", "bags of rice", 2, 7), ("plant pot", "plant pots", 3, 12),
    ("tennis ball", "tennis balls", 2, 5), ("movie ticket", "movie tickets", 7, 14), ("bus pass", "bus passes", 10, 30),
    ("loaf of bread", "loaves of bread", 2, 5), ("bottle of juice", "bottles of juice", 2, 4),
    ("puzzle", "puzzles", 8, 20), ("T-shirt", "T-shirts", 8, 25), ("candle", "candles", 3, 9),
    ("box of crayons", "boxes of crayons", 2, 6), ("jar of honey", "jars of honey", 4, 11),
    ("packet of seeds", "packets of seeds", 1, 4), ("mug", "mugs", 5, 12), ("toy car", "toy cars", 3, 10),
    ("bunch of flowers", "bunches of flowers", 5, 15), ("scarf", "scarves", 9, 24), ("kite", "kites", 6, 18),
    ("board game", "board games", 15, 40), ("pair of socks", "pairs of socks", 2, 8),
])
pool("sweet", words("""
stickers; marbles; strawberries; cookies; trading cards; seashells; candies; crayons; beads;
stamps; balloons; pencils; chocolates; grapes; buttons; toy soldiers
"""))
pool("vehicle_trip", words("train; bus; car; ferry; cyclist; delivery van; truck; motorbike"), heldout_frac=0.25)

MATH_SUFFIX_TRAIN = ["", "", " Show your reasoning step by step.", " Explain your steps.",
                     " Let's think step by step.", " Give the final answer at the end.",
                     " Answer with a number and a short explanation.", " Show your work."]
MATH_PREFIX_TRAIN = ["", "", "", "Solve this word problem: ", "Math question: ", "Here is a puzzle for you. "]
MATH_SUFFIX_HELDOUT = ["", " Work through it step by step.", " Please show each step.", " What is the answer?"]


def _math(fn):
    def wrapped(c):
        body = fn(c)
        if c.split == "heldout":
            return [body + c.choice(MATH_SUFFIX_HELDOUT)]
        return [c.choice(MATH_PREFIX_TRAIN) + body + c.choice(MATH_SUFFIX_TRAIN)]
    wrapped.__name__ = fn.__name__
    return wrapped


def math_template(heldout: bool = False):
    def deco(fn):
        TEMPLATES["math_reasoning"]["heldout" if heldout else "train"].append(_math(fn))
        return fn
    return deco


@math_template()
def m_shopping(c):
    (s1, p1, lo1, hi1), (s2, p2, lo2, hi2) = c.sample("math_item", 2)
    a, b = c.rng.randint(2, 9), c.rng.randint(2, 9)
    x, y = c.rng.randint(lo1, hi1), c.rng.randint(lo2, hi2)
    n = c.pick("name")
    return f"{n} buys {a} {p1} for ${x} each and {b} {p2} for ${y} each. How much does {n} spend in total?"


@math_template()
def m_change(c):
    s, p, lo, hi = c.pick("math_item")
    k, price = c.rng.randint(2, 6), c.rng.randint(lo, hi)
    bill = next(b for b in (10, 20, 50, 100, 200) if b > k * price)
    return f"{c.pick('name')} buys {k} {p} that cost ${price} each and pays with a ${bill} bill. How much change should they get back?"


@math_template()
def m_share(c):
    k = c.rng.randint(3, 9)
    total = k * c.rng.randint(3, 15) + c.rng.randint(0, k - 1)
    n, thing = c.pick("name"), c.pick("sweet")
    return f"{n} has {total} {thing} and wants to share them equally among {k} friends. How many {thing} does each friend get, and how many are left over?"


@math_template()
def m_distance(c):
    v, t = c.choice([40, 45, 50, 60, 72, 80, 90, 110]), c.choice([2, 3, 4, 5, 1.5, 2.5])
    veh = c.pick("vehicle_trip")
    return f"A {veh} travels at an average speed of {v} km per hour for {t} hours. How far does it travel?"


@math_template()
def m_time(c):
    v = c.choice([12, 15, 18, 20, 24, 30])
    d = v * c.choice([2, 3, 4]) // c.choice([1, 2])
    n = c.pick("name")
    return f"{n} cycles {d} km at a steady speed of {v} km per hour. How long does the ride take, in hours and minutes?"


@math_template()
def m_ages(c):
    a, b = c.sample("name", 2)
    x, k, y = c.rng.randint(5, 14), c.choice([2, 3]), c.rng.randint(2, 10)
    k = {2: "twice", 3: "three times"}[k]
    return f"{a} is {x} years old. {b} is {k} as old as {a}. How old will {b} be in {y} years, and what will the sum of their ages be then?"


@math_template()
def m_discount(c):
    item = c.pick("shop_item")
    price = c.choice([20, 40, 50, 60, 80, 120, 150, 200, 240])
    pct = c.choice([10, 20, 25, 30, 50])
    return f"A {item} normally costs ${price}. This week it is {pct}% off. What is the sale price, and how much money do you save?"


@math_template()
def m_recipe(c):
    base = c.choice([2, 4, 6])
    target = base * c.choice([2, 3]) if c.chance(0.6) else base // 2 if base > 2 else base * 2
    flour = base * c.choice([50, 75, 100, 125])
    milk = base * c.choice([40, 60, 80, 100])
    dish = c.choice(["pancakes", "muffins", "a pie", "waffles", "scones"])
    return f"A recipe for {dish} that serves {base} people uses {flour} grams of flour and {milk} ml of milk. How much flour and milk are needed to serve {target} people?"


@math_template()
def m_savings(c):
    s, p, lo, hi = c.pick("math_item")
    weekly = c.choice([5, 6, 8, 10, 12, 15])
    have = c.rng.randint(0, 30)
    cost = have + weekly * c.rng.randint(3, 12) - c.rng.randint(0, weekly - 1)
    n = c.pick("name")
    return f"{n} has ${have} and saves ${weekly} every week. How many weeks will it take before {n} can afford a new bike that costs ${cost}?"


@math_template()
def m_reading(c):
    pages, per = c.rng.randrange(120, 480, 4), c.choice([12, 15, 18, 20, 25, 30])
    days = c.rng.randint(3, max(3, pages // per - 1))
    n = c.pick("name")
    return f"A book has {pages} pages. {n} reads {per} pages every day. How many pages are left after {days} days, and how many more days will it take to finish the book?"


@math_template()
def m_garden(c):
    w = c.rng.randint(3, 15)
    l = c.rng.randint(w + 1, 25)
    cost = c.choice([3, 4, 5, 6, 8])
    n = c.pick("name")
    return f"{n}'s rectangular garden is {l} meters long and {w} meters wide. What is its area? Fencing costs ${cost} per meter. How much will it cost to put a fence all the way around it?"


@math_template()
def m_buses(c):
    students, cap_ = c.rng.randint(60, 400), c.choice([30, 35, 40, 45, 50])
    return f"A school is taking {students} students on a trip. Each bus can carry {cap_} students. How many buses are needed, and how many empty seats will there be?"


@math_template()
def m_temperature(c):
    t0, up, down = c.rng.randint(-8, 12), c.rng.randint(3, 14), c.rng.randint(4, 18)
    return f"At 6 a.m. the temperature was {t0}°C. By noon it had risen by {up} degrees, and by midnight it had fallen {down} degrees from the noon temperature. What was the temperature at midnight?"


@math_template()
def m_pizza(c):
    pizzas, slices = c.rng.randint(2, 5), c.choice([6, 8, 10, 12])
    people = c.rng.randint(3, 8)
    each = c.rng.randint(1, max(1, (pizzas * slices) // people))
    n = c.pick("name")
    return f"{n} orders {pizzas} pizzas, each cut into {slices} slices. {cap(nw(people))} people each eat {each} slice{'s' if each > 1 else ''}. How many slices are left? What fraction of all the pizza is left?"


@math_template()
def m_wage(c):
    w, h, d = c.choice([12, 14, 15, 16, 18, 20, 22, 25]), c.rng.randint(3, 8), c.rng.randint(3, 6)
    n, job = c.pick("name"), c.choice(["at a café", "at a bookshop", "as a tutor", "at a bike shop", "at a garden center"])
    return f"{n} works {job} and earns ${w} per hour. This week {n} worked {h} hours a day for {d} days. How much did {n} earn this week?"


@math_template()
def m_average(c):
    scores = [c.rng.randint(60, 95) for _ in range(3)]
    target = c.choice([t for t in range(70, 93) if 55 <= 4 * t - sum(scores) <= 100])
    n = c.pick("name")
    return f"{n} scored {scores[0]}, {scores[1]} and {scores[2]} on three tests. What score does {n} need on the fourth test to have an average of exactly {target}?"


@math_template()
def m_bakery(c):
    made = c.rng.randrange(60, 300, 6)
    morning = c.rng.randrange(10, made // 2, 2)
    item = c.choice(["muffins", "bread rolls", "croissants", "cupcakes", "bagels"])
    return f"A bakery made {made} {item}. It sold {morning} in the morning and half of the remaining {item} in the afternoon. How many {item} were left at closing time?"


@math_template()
def m_tank(c):
    cap_, rate = c.rng.randrange(200, 2000, 50), c.choice([10, 20, 25, 40, 50])
    have = c.rng.randrange(0, cap_ // 2, 10)
    return f"A water tank holds {cap_} liters and already contains {have} liters. A hose adds {rate} liters per minute. How many minutes will it take to fill the tank?"


@math_template()
def m_movie(c):
    h, m = c.rng.randint(1, 9), c.choice([0, 10, 15, 20, 30, 40, 45, 50])
    dur = c.rng.randrange(85, 175, 5)
    return f"A film starts at {h}:{m:02d} p.m. and lasts {dur} minutes. At what time does it end?"


@math_template()
def m_coins(c):
    q, d, n = c.rng.randint(2, 15), c.rng.randint(1, 20), c.rng.randint(0, 12)
    name = c.pick("name")
    return f"{name} has {q} quarters, {d} dimes and {n} nickels in a piggy bank. How much money is that in total, in dollars and cents?"


@math_template()
def m_tickets(c):
    a, ch = c.rng.randint(40, 250), c.rng.randint(20, 200)
    pa, pc = c.choice([8, 10, 12, 15]), c.choice([4, 5, 6])
    return f"A school play sold {a} adult tickets at ${pa} each and {ch} child tickets at ${pc} each. How much money did the play raise in total?"


@math_template()
def m_work_rate(c):
    a, b = c.choice([(3, 6), (4, 12), (6, 12), (10, 15), (2, 6), (6, 3), (12, 4), (5, 20)])
    n1, n2 = c.sample("name", 2)
    task = c.choice(["paint a fence", "clean the garage", "pick all the apples in the orchard", "sort the library books"])
    return f"{n1} can {task} in {a} hours. {n2} can do the same job in {b} hours. How long will it take if they work together?"


@math_template()
def m_ratio(c):
    a, b = c.choice([(2, 3), (3, 5), (1, 4), (4, 5), (3, 7), (2, 5)])
    total = (a + b) * c.rng.randint(3, 12)
    c1, c2 = c.rng.sample(["red", "blue", "green", "yellow", "white", "black"], 2)
    return f"A bag contains {c1} and {c2} marbles in the ratio {a}:{b}. There are {total} marbles in total. How many {c1} marbles are there?"


@math_template()
def m_percent(c):
    n = c.choice([200, 250, 300, 400, 450, 500, 600, 800])
    p1, p2 = c.choice([20, 25, 30, 40]), c.choice([10, 15, 20, 35])
    return f"There are {n} students at a school. {p1}% walk to school, {p2}% come by bike, and the rest take the bus. How many students take the bus?"


@math_template()
def m_stamps(c):
    a = c.rng.randint(20, 90)
    gave = c.rng.randint(3, a // 2)
    bought = c.choice([b for b in range(5, 41) if (a - gave + b) % 4 == 0])
    n1, n2 = c.sample("name", 2)
    thing = c.pick("sweet")
    return f"{n1} had {a} {thing}, gave {gave} of them to {n2}, and then bought {bought} more. Later, {n1} lost a quarter of them. How many {thing} does {n1} have now?"


# --- held-out math templates ----------------------------------------------------------------

@math_template(heldout=True)
def m_ho_rows(c):
    r, k = c.rng.randint(4, 12), c.rng.randint(5, 15)
    dead = c.rng.randint(2, 9)
    veg = c.choice(["lettuces", "cabbages", "leeks", "pepper plants"])
    n = c.pick("name")
    return f"{n} plants {r} rows of {veg} with {k} plants in each row. {dead} of them do not grow, and {n} gives away a third of the rest to neighbors. How many does {n} keep?"


@math_template(heldout=True)
def m_ho_fuel(c):
    per100, dist, price = c.choice([5, 6, 7, 8]), c.choice([250, 300, 350, 400, 450]), c.choice(["1.50", "1.60", "1.80", "2.00"])
    return f"A car uses {per100} liters of fuel every 100 km. Fuel costs ${price} per liter. How much does the fuel cost for a {dist} km journey?"


@math_template(heldout=True)
def m_ho_bags(c):
    guests, st, pack = c.rng.randint(8, 24), c.rng.randint(2, 5), c.choice([10, 12, 15, 20])
    n = c.pick("name")
    return f"{n} is making party bags for {guests} guests. Each bag gets {st} stickers, and stickers are sold in packs of {pack}. How many packs does {n} need to buy, and how many stickers will be left over?"


@math_template(heldout=True)
def m_ho_consecutive(c):
    x = c.rng.randint(5, 80)
    return f"The sum of three consecutive whole numbers is {3 * x + 3}. What are the three numbers?"


@math_template(heldout=True)
def m_ho_bill(c):
    people, bill, tip = c.choice([3, 4, 5]), c.rng.randrange(60, 240, 6), c.choice([10, 15, 20])
    people = {3: "Three", 4: "Four", 5: "Five"}[people]
    return f"{people} friends share a restaurant bill of ${bill} and add a {tip}% tip. If they split the total equally, how much does each person pay?"


@math_template(heldout=True)
def m_ho_trains(c):
    v1, v2 = c.choice([60, 70, 80, 90]), c.choice([50, 60, 100, 120])
    d = (v1 + v2) * c.choice([1.5, 2, 2.5, 3])
    return f"Two trains leave stations {d:g} km apart at the same moment and travel toward each other, one at {v1} km/h and the other at {v2} km/h. How long will it take before they meet?"


@math_template(heldout=True)
def m_ho_paint(c):
    l, h, cov = c.rng.randint(4, 12), c.choice([2.5, 3]), c.choice([8, 10, 12])
    return f"A wall is {l} meters long and {h:g} meters high, and it has a window that is 1 meter wide and 2 meters high. One can of paint covers {cov} square meters. How many cans are needed to paint the wall once?"


@math_template(heldout=True)
def m_ho_pocket(c):
    a, w = c.choice([6, 9, 12, 15]), c.rng.randint(4, 12)
    n = c.pick("name")
    return f"{n} gets ${a} of pocket money every week, spends a third of it on snacks and saves the rest. How much has {n} saved after {w} weeks?"


@math_template(heldout=True)
def m_ho_clock(c):
    g = c.choice([2, 3, 4, 5, 7])
    return f"A kitchen clock gains {g} minutes every day. It was set to the correct time at noon on Monday. What time will it show at noon on the following Monday?"


@math_template(heldout=True)
def m_ho_theater(c):
    rows, per = c.choice([(20, 25), (16, 25), (12, 50), (40, 10), (25, 20)])
    empty = rows * per * c.choice([10, 20, 25, 40]) // 100
    return f"A theater has {rows} rows with {per} seats in each row. At tonight's show, {empty} seats are empty. What percentage of the seats are filled?"


@math_template(heldout=True)
def m_ho_steps(c):
    spm, mins, goal = c.choice([90, 100, 110, 120]), c.choice([20, 25, 30, 40]), c.choice([8000, 10000, 12000])
    n = c.pick("name")
    return f"{n} takes about {spm} steps per minute while walking. {n} walks for {mins} minutes in the morning and the same amount in the evening. How many more steps does {n} need to reach {goal} steps for the day?"


# ======================================== code ============================================

from string import Template  # noqa: E402  (kept next to the code templates that use it)


def code(src: str, **kw) -> str:
    return Template(src.strip("\n")).substitute(**kw)


pool("fn_task", words("""
returns the largest of three numbers; checks whether a string is a palindrome;
counts the vowels in a string; reverses the order of the words in a sentence;
returns the n-th Fibonacci number; removes duplicates from a list while keeping the original order;
converts a temperature from Celsius to Fahrenheit; returns the second largest number in a list;
checks whether a number is prime; counts how many times each word appears in a text;
flattens a list of lists; returns the sum of the digits of an integer;
capitalizes the first letter of every word in a string; checks whether two strings are anagrams;
finds the most common element in a list; merges two sorted lists into one sorted list;
returns only the even numbers from a list;
computes the average of a list of numbers and returns None for an empty list;
converts a number of seconds into hours, minutes and seconds; checks whether a year is a leap year;
returns the factorial of a number; finds the longest word in a sentence;
rotates a list to the right by k positions;
checks that a password has at least 8 characters, one digit and one uppercase letter;
splits a list into chunks of size n; returns the greatest common divisor of two numbers;
converts a Roman numeral to an integer; checks whether a list is sorted in ascending order;
returns the running totals of a list of numbers; groups a list of words by their first letter;
removes all punctuation from a string; returns the items that appear in both of two lists;
generates a random password of a given length;
computes the total price of a shopping cart given as a list of (price, quantity) pairs;
converts a string such as "Hello World" to snake_case;
finds the missing number in a list that contains the numbers 1 to n except one;
returns the index of the first non-repeating character in a string;
checks whether the brackets in a string are balanced;
returns a list of the squares of the numbers from 1 to n;
counts the uppercase and lowercase letters in a string;
calculates compound interest given a principal, a yearly rate and a number of years;
returns the median of a list of numbers;
shortens a string to n characters and adds "..." if it was longer;
transposes a matrix given as a list of lists; converts a list of key-value pairs into a dictionary;
checks whether a string contains only digits; returns the number of days between two dates;
finds all pairs of numbers in a list that add up to a target value;
converts a decimal number to binary without using bin();
returns the initials of a full name, for example "Ada Lovelace" becomes "A.L.";
counts the number of words in a sentence;
returns True if every number in a list is positive
"""), keep_train=[  # topics that train-only snippets / bug fixes already cover
    "checks whether a string is a palindrome", "counts the vowels in a string",
    "converts a temperature from Celsius to Fahrenheit", "returns the factorial of a number",
    "returns the greatest common divisor of two numbers", "splits a list into chunks of size n",
    "computes the average of a list of numbers and returns None for an empty list",
    "counts how many times each word appears in a text", "counts the number of words in a sentence",
    "returns only the even numbers from a list", "returns a list of the squares of the numbers from 1 to n",
    "returns the largest of three numbers", "returns the n-th Fibonacci number",
], force_heldout=[  # topics that held-out-only snippets cover
    "removes duplicates from a list while keeping the original order",
    "converts a number of seconds into hours, minutes and seconds",
    'shortens a string to n characters and adds "..." if it was longer',
    "groups a list of words by their first letter",
])

pool("regex_target", words("""
dates in the format YYYY-MM-DD; phone numbers written like 555-123-4567;
hex color codes such as #1a2b3c; words that start with a capital letter;
times in 24-hour format like 14:05; five-digit zip codes; hashtags in a social media post;
whole numbers with an optional minus sign; URLs that start with http or https;
a word that is repeated twice in a row, like "the the"; file names ending in .jpg or .png;
IPv4 addresses such as 192.168.0.1; lines that start with a number followed by a period;
prices written like $12.99; simple email addresses
"""))

pool("py_howto", words("""
read a CSV file and print each row; sort a dictionary by its values; get today's date as a string;
merge two dictionaries; read and write a JSON file; loop over two lists at the same time;
check whether a file exists; format a float with two decimal places;
measure how long a piece of code takes to run; convert a string like "2024-03-15" into a date;
remove whitespace from the start and end of a string; pick a random item from a list;
find the key with the largest value in a dictionary; read command-line arguments;
write a list of strings to a text file, one per line; count items with collections.Counter;
handle a division-by-zero error; define a simple dataclass; reverse a string;
split a string on commas and strip the spaces; get the last three items of a list;
create a dictionary from two lists; check the type of a variable; round a number to the nearest ten
"""))

pool("py_class", [
    ("BankAccount", "has deposit and withdraw methods and never lets the balance go below zero"),
    ("Stack", "supports push, pop, peek and is_empty"),
    ("Rectangle", "stores a width and a height and has methods for the area and the perimeter"),
    ("TodoList", "can add tasks, mark them as done and list the unfinished ones"),
    ("Inventory", "tracks item quantities and prints a warning when an item runs low"),
    ("Temperature", "stores a value in Celsius and can return it in Fahrenheit and Kelvin"),
    ("Stopwatch", "can be started and stopped and reports the elapsed seconds"),
    ("ShoppingCart", "can add and remove items and compute the total price"),
    ("Library", "lets members borrow and return books and shows which books are available"),
    ("Queue", "has enqueue and dequeue methods and is built on a list"),
    ("Playlist", "can add songs, shuffle them and return the total duration"),
    ("Student", "stores a name and a list of grades and can compute the average grade"),
    ("ParkingLot", "has a fixed number of spaces and keeps track of which ones are free"),
    ("Recipe", "stores ingredients with amounts and can scale them for more servings"),
    ("Thermostat", "has a target temperature and a method that says whether to heat or cool"),
])

pool("js_task", words("""
changes a button's text to "Clicked!" when it is clicked;
shows the current time on the page and updates it every second;
hides a paragraph when a checkbox is unchecked;
stops a form from being submitted if the email field is empty;
adds a new item to a list when the user presses Enter in a text box;
fetches JSON from a URL and logs the result;
shows how many characters have been typed into a textarea;
toggles a dark-mode class on the page body;
saves the user's name in localStorage and greets them on their next visit;
sorts an array of objects by their price property;
only runs a search function after the user has stopped typing for 300 milliseconds;
copies some text to the clipboard when a button is clicked;
counts down from 10 to 0 on the page, one number per second;
picks a random quote from an array and shows it when a button is pressed
"""))

# --- SQL tables: name -> (columns, tasks) ---------------------------------------------------
SQL_TABLES = {
    "employees": ("id, name, department, salary, hire_date", [
        "returns the names and salaries of everyone in the {dept} department",
        "shows the average salary for each department",
        "lists the five highest-paid employees",
        "counts how many employees were hired after {year}",
        "finds departments with more than {n} employees",
        "finds employees who earn more than the average salary",
    ]),
    "orders": ("id, customer_id, order_date, total_amount, status", [
        "returns all orders placed in {year} with a total above {amount}",
        "shows the total amount spent by each customer, highest first",
        "counts the orders for each status",
        "finds the customer with the most orders",
        "lists orders that are still 'pending' after more than {n} days",
    ]),
    "books": ("id, title, author, year_published, genre, price", [
        "lists all {genre} books published before {year}, ordered by year",
        "shows how many books each author has written",
        "finds the cheapest book in each genre",
        "returns the titles of books that contain the word '{word}'",
        "calculates the average price of books per decade",
    ]),
    "students": ("id, name, grade_level, math_score, reading_score", [
        "returns students whose math score is higher than their reading score",
        "calculates the average math and reading score for each grade level",
        "finds the top three students by combined score",
        "counts how many students in each grade scored below {n} in math",
    ]),
    "products": ("id, name, category, price, stock", [
        "lists all products that are out of stock",
        "increases the price of every product in the '{category}' category by 10 percent",
        "shows the total stock value (price times stock) for each category",
        "deletes products that have had zero stock and a price below {n}",
    ]),
    "flights": ("id, origin, destination, departure_time, duration_minutes, price", [
        "finds all flights from {city} that take less than {n} minutes",
        "returns the average price for each destination",
        "lists the three longest flights departing each day",
    ]),
    "movies": ("id, title, release_year, rating, box_office", [
        "lists the ten highest-rated movies released after {year}",
        "counts how many movies were released each year",
        "finds movies with a rating above 8 but box office below the average",
    ]),
    # held-out only tables
    "patients": ("id, name, birth_date, ward, admitted_on", [
        "counts how many patients are in each ward",
        "finds patients who were admitted in the last 7 days",
        "lists patients born before 1950, oldest first",
    ]),
    "bike_rentals": ("id, bike_id, start_station, end_station, start_time, end_time", [
        "finds the ten most popular start stations",
        "computes the average rental duration in minutes for each bike",
        "lists rentals that started and ended at the same station",
    ]),
}
SQL_HELDOUT_TABLES = ["patients", "bike_rentals"]
SQL_TRAIN_TABLES = [t for t in SQL_TABLES if t not in SQL_HELDOUT_TABLES]
SQL_SLOTS = {"dept": ["Sales", "Marketing", "Engineering", "Finance", "Support"],
             "genre": ["mystery", "science fiction", "poetry", "history", "fantasy"],
             "category": ["garden", "kitchen", "toys", "office", "sports"],
             "word": ["river", "night", "garden", "secret", "winter"]}


def sql_task(c, tables: list[str]) -> tuple[str, str, str]:
    table = c.choice(tables)
    cols, tasks = SQL_TABLES[table]
    task = c.choice(tasks).format(
        year=c.rng.randint(2012, 2023), n=c.choice([5, 10, 30, 45, 50, 90, 120]),
        amount=c.choice([50, 100, 250, 500]), city=c.pick("city"),
        **{k: c.choice(v) for k, v in SQL_SLOTS.items()})
    return table, cols, task


SQL_EXPLAIN = [
    "SELECT department, COUNT(*) AS staff, AVG(salary) AS avg_salary\nFROM employees\nWHERE hire_date >= '$year-01-01'\nGROUP BY department\nHAVING COUNT(*) > $n\nORDER BY avg_salary DESC;",
    "SELECT c.name, SUM(o.total_amount) AS spent\nFROM customers c\nJOIN orders o ON o.customer_id = c.id\nWHERE o.status = 'delivered'\nGROUP BY c.name\nORDER BY spent DESC\nLIMIT $n;",
    "SELECT title, author\nFROM books\nWHERE genre = '$genre' AND price < $price\nORDER BY year_published;",
    "UPDATE products\nSET price = price * 0.9\nWHERE category = '$category' AND stock > $n;",
    "SELECT name FROM students\nWHERE math_score > (SELECT AVG(math_score) FROM students)\nORDER BY math_score DESC;",
    "SELECT destination, MIN(price) AS cheapest\nFROM flights\nWHERE origin = '$city'\nGROUP BY destination;",
    "SELECT release_year, COUNT(*)\nFROM movies\nWHERE rating >= $rating\nGROUP BY release_year\nORDER BY release_year;",
    "DELETE FROM orders\nWHERE status = 'cancelled' AND order_date < '$year-01-01';",
]


# --- Python / JS snippets ------------------------------------------------------------------

def _ident(c, options: list[str]) -> str:
    return c.choice(options)


PY_EXPLAIN_SNIPPETS = [
    lambda c: code("""
def $fn(numbers):
    total = 0
    for n in numbers:
        if n % $k == 0:
            total += n
    return total
""", fn=_ident(c, ["sum_multiples", "add_some", "total_of", "filtered_sum"]), k=c.choice([2, 3, 4, 5])),
    lambda c: code("""
def $fn(text):
    count = 0
    for ch in text.lower():
        if ch in "$chars":
            count += 1
    return count
""", fn=_ident(c, ["count_letters", "tally", "count_chars"]), chars=c.choice(["aeiou", "xyz", "aeiouy", "0123456789"])),
    lambda c: code("""
def $fn(sentence):
    counts = {}
    for word in sentence.split():
        word = word.lower().strip(".,!?")
        counts[word] = counts.get(word, 0) + 1
    return counts
""", fn=_ident(c, ["word_counts", "tally_words", "frequencies"])),
    lambda c: code("""
$var = [x * x for x in range($n) if x % $k == 0]
print($var)
""", var=_ident(c, ["squares", "values", "result", "nums"]), n=c.rng.randint(8, 30), k=c.choice([2, 3, 4])),
    lambda c: code("""
n = $N
steps = 0
while n > 1:
    n = n // 2
    steps += 1
print(steps)
""", N=c.rng.randint(10, 5000)),
    lambda c: code("""
def $fn(n):
    if n <= 1:
        return 1
    return n * $fn(n - 1)
""", fn=_ident(c, ["fact", "product_down", "f", "mystery"])),
    lambda c: code("""
names = [$names]
scores = [$scores]
result = dict(zip(names, scores))
best = max(result, key=result.get)
print(best, result[best])
""", names=", ".join(f'"{n}"' for n in c.sample("name", 3)), scores=", ".join(str(c.rng.randint(40, 99)) for _ in range(3))),
    lambda c: code("""
$var = [$items]
print(sorted($var, key=len))
""", var=_ident(c, ["words", "fruits", "animals"]), items=", ".join(f'"{w}"' for w in c.rng.sample(
        ["kiwi", "banana", "fig", "cherry", "apple", "plum", "mango", "pear"], 4))),
    lambda c: code("""
class $cls:
    def __init__(self, balance=0):
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount
        return self.balance
""", cls=_ident(c, ["Wallet", "Account", "PiggyBank", "Purse"])),
    lambda c: code("""
def $fn(path):
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []
""", fn=_ident(c, ["load_lines", "read_items", "non_empty_lines"])),
    lambda c: code("""
def $fn(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]
""", fn=_ident(c, ["chunk", "batches", "split_up", "groups_of"])),
    lambda c: code("""
def $fn(a, b):
    while b:
        a, b = b, a % b
    return a
""", fn=_ident(c, ["gcd", "common", "mystery", "g"])),
]

JS_SNIPPETS = [
    lambda c: code("""
function $fn(arr) {
  return arr.filter(x => x > $k).map(x => x * 2);
}
""", fn=_ident(c, ["doubleBig", "process", "transform"]), k=c.rng.randint(1, 20)),
    lambda c: code("""
const $var = [$nums].reduce((acc, n) => acc + n, 0);
console.log($var);
""", var=_ident(c, ["total", "sum", "result"]), nums=", ".join(str(c.rng.randint(1, 50)) for _ in range(c.rng.randint(3, 6)))),
    lambda c: code("""
async function $fn(url) {
  const response = await fetch(url);
  if (!response.ok) {
    throw new Error("Request failed: " + response.status);
  }
  return response.json();
}
""", fn=_ident(c, ["getData", "loadJson", "fetchItems"])),
    lambda c: code("""
function $fn(words) {
  const counts = {};
  for (const w of words) {
    counts[w] = (counts[w] || 0) + 1;
  }
  return counts;
}
""", fn=_ident(c, ["countWords", "tally", "histogram"])),
    lambda c: code("""
function $fn(str) {
  return str
    .split(" ")
    .map(w => w[0].toUpperCase() + w.slice(1))
    .join(" ");
}
""", fn=_ident(c, ["titleCase", "capitalizeWords", "fixCase"])),
]

JS_SNIPPETS_HELDOUT = [
    lambda c: code("""
function $fn(list, key) {
  const seen = new Set();
  return list.filter(item => {
    if (seen.has(item[key])) return false;
    seen.add(item[key]);
    return true;
  });
}
""", fn=_ident(c, ["uniqueBy", "dedupe"])),
    lambda c: code("""
function $fn(ms) {
  let remaining = ms;
  const minutes = Math.floor(remaining / 60000);
  remaining -= minutes * 60000;
  const seconds = Math.round(remaining / 1000);
  return minutes + ":" + String(seconds).padStart(2, "0");
}
""", fn=_ident(c, ["formatDuration", "toClock"])),
    lambda c: code("""
function $fn(grid) {
  let count = 0;
  for (const row of grid) {
    for (const cell of row) {
      if (cell === "$mark") count++;
    }
  }
  return count;
}
""", fn=_ident(c, ["countMarks", "tallyCells"]), mark=c.choice(["X", "O", "#"])),
    lambda c: code("""
function $fn(text, maxLength) {
  if (text.length <= maxLength) return text;
  const cut = text.slice(0, maxLength);
  return cut.slice(0, cut.lastIndexOf(" ")) + "…";
}
""", fn=_ident(c, ["shorten", "ellipsize"])),
    lambda c: code("""
const $fn = (items) =>
  items.reduce((groups, item) => {
    (groups[item.type] ||= []).push(item.name);
    return groups;
  }, {});
""", fn=_ident(c, ["groupByType", "bucketize"])),
]

# buggy code: (description of intended behaviour, code)
PY_BUGS = [
    lambda c: ("add up all whole numbers from 1 to n", code("""
def $fn(n):
    total = 0
    for i in range(1, n):
        total += i
    return total
""", fn=_ident(c, ["sum_to", "sum_up_to", "total_upto"]))),
    lambda c: ("return the largest number in a list that may contain negative numbers", code("""
def $fn(numbers):
    best = 0
    for n in numbers:
        if n > best:
            best = n
    return best
""", fn=_ident(c, ["largest", "find_max", "biggest"]))),
    lambda c: ("return the average of a list of numbers", code("""
def $fn(numbers):
    total = 0
    for n in numbers:
        total += n
        return total / len(numbers)
""", fn=_ident(c, ["average", "mean", "avg"]))),
    lambda c: ("check whether a word is a palindrome, ignoring upper and lower case", code("""
def $fn(word):
    return word == word[::-1]
""", fn=_ident(c, ["is_palindrome", "palindrome", "reads_same_backwards"]))),
    lambda c: ("apply a percentage discount to a price", code("""
def $fn(price, percent):
    new_price = price - price * percent / 100
""", fn=_ident(c, ["apply_discount", "discounted", "sale_price"]))),
    lambda c: ("add an item to a new basket each time it is called without a basket", code("""
def $fn(item, basket=[]):
    basket.append(item)
    return basket
""", fn=_ident(c, ["add_item", "put_in_basket", "add_to_cart"]))),
    lambda c: ("build a greeting that includes the person's age", code("""
def $fn(name, age):
    return "Hello " + name + ", you are " + age + " years old."
""", fn=_ident(c, ["greet", "welcome", "hello_message"]))),
    lambda c: ("convert Celsius to Fahrenheit, keeping decimals", code("""
def $fn(c):
    return c * 9 // 5 + 32
""", fn=_ident(c, ["to_fahrenheit", "c_to_f", "celsius_to_f"]))),
    lambda c: ("count how many words in a list are longer than five letters", code("""
def $fn(words):
    count = 0
    for w in words:
        if len(w) > 5:
            count =+ 1
    return count
""", fn=_ident(c, ["count_long", "long_words", "num_long_words"]))),
    lambda c: ("return the last element of a list", code("""
def $fn(items):
    return items[len(items)]
""", fn=_ident(c, ["last", "last_item", "final_element"]))),
]
PY_BUGS_HELDOUT = [
    lambda c: ("return a list with the sum of each pair of neighboring numbers", code("""
def $fn(nums):
    result = []
    for i in range(len(nums)):
        result.append(nums[i] + nums[i + 1])
    return result
""", fn=_ident(c, ["pairwise_sums", "neighbor_sums"]))),
    lambda c: ("remove all negative numbers from a list", code("""
def $fn(nums):
    for n in nums:
        if n < 0:
            nums.remove(n)
    return nums
""", fn=_ident(c, ["drop_negatives", "remove_negatives"]))),
    lambda c: ("check whether a string such as \"23:59\" is a valid time on a 24-hour clock", code("""
def $fn(text):
    hours, minutes = text.split(":")
    return 0 <= int(hours) <= 24 and 0 <= int(minutes) <= 60
""", fn=_ident(c, ["is_valid_time", "valid_clock_time"]))),
    lambda c: ("return the total number of letters in a list of words", code("""
def $fn(words):
    for w in words:
        total = 0
        total += len(w)
    return total
""", fn=_ident(c, ["total_length", "letters_in_all"]))),
    lambda c: ("return a new list with every price increased by 10 percent, leaving the original list unchanged", code("""
def $fn(prices):
    new_prices = prices
    for i in range(len(new_prices)):
        new_prices[i] = new_prices[i] * 1.1
    return new_prices
""", fn=_ident(c, ["raise_prices", "add_ten_percent"]))),
]
JS_BUGS = [
    lambda c: ("return true if the age is 18 or more", code("""
function $fn(age) {
  if (age = 18) {
    return true;
  }
  return age > 18;
}
""", fn=_ident(c, ["isAdult", "canVote", "isGrownUp"]))),
    lambda c: ("print every element of an array", code("""
function $fn(arr) {
  for (let i = 0; i <= arr.length; i++) {
    console.log(arr[i]);
  }
}
""", fn=_ident(c, ["printAll", "logItems", "showEach"]))),
    lambda c: ("add up the prices in an array of strings like [\"3\", \"4.5\"]", code("""
function $fn(prices) {
  let total = 0;
  for (const p of prices) {
    total += p;
  }
  return total;
}
""", fn=_ident(c, ["sumPrices", "totalCost", "addPrices"]))),
]

# output-prediction snippets (deterministic small programs)
PY_OUTPUT = [
    lambda c: code("""
nums = [$nums]
print(sum(n for n in nums if n > $k))
""", nums=", ".join(str(c.rng.randint(1, 30)) for _ in range(5)), k=c.rng.randint(5, 20)),
    lambda c: code("""
word = "$word"
print(word[1:4], word[::-1], len(word))
""", word=c.choice(["lantern", "giraffe", "harbor", "pebble", "thunder", "biscuit", "meadow", "compass"])),
    lambda c: code("""
x = $a
for i in range($n):
    x = x * 2 - 1
print(x)
""", a=c.rng.randint(2, 9), n=c.rng.randint(2, 5)),
    lambda c: code("""
stock = {"apples": $a, "pears": $b}
stock["apples"] -= $k
stock["plums"] = $m
print(len(stock), stock["apples"])
""", a=c.rng.randint(10, 40), b=c.rng.randint(1, 20), k=c.rng.randint(1, 9), m=c.rng.randint(1, 9)),
    lambda c: code("""
items = [$a, $b, $d]
items.append($e)
items.insert(0, $f)
items.pop()
print(items)
""", a=c.rng.randint(1, 9), b=c.rng.randint(1, 9), d=c.rng.randint(1, 9), e=c.rng.randint(10, 20), f=c.rng.randint(20, 30)),
    lambda c: code("""
names = [$names]
print(", ".join(n.upper() for n in names if len(n) > $k))
""", names=", ".join(f'"{n}"' for n in c.sample("name", 4)), k=c.choice([3, 4])),
    lambda c: code("""
count = 0
for i in range($a):
    for j in range($b):
        if (i + j) % 2 == 0:
            count += 1
print(count)
""", a=c.rng.randint(2, 5), b=c.rng.randint(2, 5)),
]
PY_OUTPUT_HELDOUT = [
    lambda c: code("""
total = 0
for i in range(1, $n + 1):
    if i % $k == 0:
        continue
    total += i
print(total)
""", n=c.rng.randint(6, 15), k=c.choice([2, 3])),
    lambda c: code("""
words = [$words]
lengths = {w: len(w) for w in words}
print(max(lengths, key=lengths.get), sum(lengths.values()))
""", words=", ".join(f'"{w}"' for w in c.rng.sample(["owl", "badger", "heron", "mole", "otter", "wren", "stoat"], 3))),
    lambda c: code("""
text = "$text"
print(text.count("$ch"), text.find("$ch"), text.title())
""", text=c.choice(["banana bread", "paper plane", "tea for two", "open sesame"]), ch=c.choice(["a", "e", "p"])),
    lambda c: code("""
queue = [$a, $b, $d]
while queue:
    item = queue.pop(0)
    if item % 2:
        queue.append(item - 1)
    print(item, end=" ")
""", a=c.rng.randint(1, 6), b=c.rng.randint(1, 6), d=c.rng.randint(1, 6)),
    lambda c: code("""
grid = [[$a, $b], [$d, $e]]
flat = [x for row in grid for x in row]
print(flat, flat[::-1][0], len(grid[0]))
""", a=c.rng.randint(1, 9), b=c.rng.randint(1, 9), d=c.rng.randint(1, 9), e=c.rng.randint(1, 9)),
]


def fence(lang: str, src: str) -> str:
    return f"```{lang}\n{src}\n```"


@template("code")
def code_py_fn(c):
    return [c.choice(["Write a Python function that {t}.", "Write a Python function that {t}. Include a docstring.",
                      "Can you write a Python function that {t}?"]).format(t=c.pick("fn_task"))]


@template("code")
def code_py_fn_examples(c):
    return [f"Write a Python function that {c.pick('fn_task')}, and show a couple of example calls with their output."]


@template("code")
def code_js_fn(c):
    tasks = [t for t in c.pool("fn_task") if not any(w in t for w in ("None", "bin()", "True"))]
    return [c.choice(["Write a JavaScript function that {t}.",
                      "In JavaScript, how would I write a function that {t}? Please explain the code briefly."]
                     ).format(t=c.choice(tasks))]


@template("code")
def code_sql_write(c):
    table, cols, task = sql_task(c, SQL_TRAIN_TABLES)
    return [c.choice([
        f"Write a SQL query that {task}. The table is `{table}` with columns: {cols}.",
        f"I have a table `{table}({cols})`. Write a SQL query that {task}.",
        f"Given the table {table} ({cols}), write a query that {task}, and explain each clause.",
    ])]


@template("code")
def code_sql_explain(c):
    q = code(c.choice(SQL_EXPLAIN), year=c.rng.randint(2015, 2023), n=c.choice([3, 5, 10, 20]),
             genre=c.choice(SQL_SLOTS["genre"]), price=c.choice([10, 15, 20]),
             category=c.choice(SQL_SLOTS["category"]), city=c.pick("city"), rating=c.choice([7, 8]))
    return [c.choice(["Explain what this SQL query does:\n\n", "What will this query return? Explain it step by step.\n\n"])
            + fence("sql", q)]


@template("code")
def code_py_explain(c):
    return [c.choice(["Explain what this Python code does:\n\n", "Can you explain this code to a beginner?\n\n",
                      "What does this function do? Give an example input and output.\n\n"])
            + fence("python", c.choice(PY_EXPLAIN_SNIPPETS)(c))]


@template("code")
def code_js_explain(c):
    return [c.choice(["Explain what this JavaScript code does:\n\n", "What does this JavaScript snippet do?\n\n"])
            + fence("javascript", c.choice(JS_SNIPPETS)(c))]


@template("code")
def code_py_bug(c):
    desc, src = c.choice(PY_BUGS)(c)
    return [c.choice([
        f"This function should {desc}, but it has a bug. Find it and fix it.\n\n{fence('python', src)}",
        f"Find and fix the bug in this Python code. It is supposed to {desc}.\n\n{fence('python', src)}",
        f"{fence('python', src)}\n\nWhy doesn't this {desc}? Show a corrected version.",
    ])]


@template("code")
def code_js_bug(c):
    desc, src = c.choice(JS_BUGS)(c)
    return [f"This JavaScript function should {desc}, but it doesn't work correctly. What is wrong?\n\n{fence('javascript', src)}"]


@template("code")
def code_output(c):
    return [c.choice(["What is the output of this code?\n\n", "What does this print? Explain briefly.\n\n"])
            + fence("python", c.choice(PY_OUTPUT)(c))]


@template("code")
def code_py_to_js(c):
    return ["Rewrite this Python code in JavaScript:\n\n" + fence("python", c.choice(PY_EXPLAIN_SNIPPETS)(c))]


@template("code")
def code_type_hints(c):
    src = c.choice(PY_EXPLAIN_SNIPPETS[:3] + PY_EXPLAIN_SNIPPETS[5:6] + PY_EXPLAIN_SNIPPETS[10:])(c)
    return ["Add type hints and a docstring to this function:\n\n" + fence("python", src)]


@template("code")
def code_tests(c):
    src = c.choice(PY_EXPLAIN_SNIPPETS[:3] + PY_EXPLAIN_SNIPPETS[5:6] + PY_EXPLAIN_SNIPPETS[10:])(c)
    return [c.choice(["Write a few pytest unit tests for this function:\n\n",
                      "How would you test this function? Write some unit tests.\n\n"]) + fence("python", src)]


@template("code")
def code_complexity(c):
    src = c.choice(PY_EXPLAIN_SNIPPETS[:3] + PY_EXPLAIN_SNIPPETS[5:6] + PY_EXPLAIN_SNIPPETS[10:])(c)
    return ["What is the time complexity of this function? Explain your answer.\n\n" + fence("python", src)]


@template("code")
def code_regex(c):
    return [c.choice(["Write a regular expression that matches {t}, and show how to use it in Python.",
                      "Give me a regex for {t} and explain each part of it.",
                      "How can I find {t} in a string using JavaScript?"]).format(t=c.pick("regex_target"))]


@template("code")
def code_howto(c):
    return [c.choice(["How do I {t} in Python? Show a short example.", "What's the simplest way to {t} in Python?"]
                     ).format(t=c.pick("py_howto"))]


@template("code")
def code_class(c):
    cls, desc = c.pick("py_class")
    return [c.choice([f"Write a Python class called {cls} that {desc}.",
                      f"Create {a_an(cls)} class in Python that {desc}. Add a short usage example."])]


@template("code")
def code_comprehension(c):
    var, n, k = c.choice(["result", "evens", "out", "picked"]), c.rng.randint(5, 50), c.choice([2, 3, 5])
    op = c.choice(["i * i", "i + 1", "str(i)", "i * 10"])
    src = code("""
$var = []
for i in range($n):
    if i % $k == 0:
        $var.append($op)
""", var=var, n=n, k=k, op=op)
    return [c.choice(["Convert this loop into a list comprehension:\n\n",
                      "Can this be written more concisely in Python?\n\n"]) + fence("python", src)]


@template("code")
def code_js_browser(c):
    return [c.choice(["Write a JavaScript snippet that {t}.", "How can I write JavaScript that {t}? Keep it simple."]
                     ).format(t=c.pick("js_task"))]


@template("code")
def code_refactor(c):
    n1, n2 = c.rng.sample(["a", "b", "x", "y", "tmp", "lst"], 2)
    lim = c.rng.randint(10, 100)
    src = code("""
def f($l):
    $x = []
    for i in range(0, len($l)):
        if $l[i] > $lim:
            if $l[i] % 2 == 0:
                $x.append($l[i])
    return $x
""", l=n1, x=n2, lim=lim)
    return ["Refactor this Python function so it is easier to read, and give it a better name:\n\n" + fence("python", src)]


# --- held-out code templates ------------------------------------------------------------------

@template("code", heldout=True)
def code_ho_impl(c):
    return [f"Implement a function in Python that {c.pick('fn_task')}, then show two example calls and their results."]


@template("code", heldout=True)
def code_ho_bug(c):
    desc, src = c.choice(PY_BUGS_HELDOUT)(c)
    return [f"This function is supposed to {desc}, but it gives wrong results or crashes. What is wrong, and how would you fix it?\n\n{fence('python', src)}"]


@template("code", heldout=True)
def code_ho_sql(c):
    table, cols, task = sql_task(c, SQL_HELDOUT_TABLES)
    return [f"Using the table `{table}` with columns {cols}, write SQL that {task}."]


@template("code", heldout=True)
def code_ho_js_walk(c):
    return ["Walk me through this JavaScript function line by line:\n\n" + fence("javascript", c.choice(JS_SNIPPETS_HELDOUT)(c))]


@template("code", heldout=True)
def code_ho_output(c):
    return ["Predict what this Python snippet prints, and explain why:\n\n" + fence("python", c.choice(PY_OUTPUT_HELDOUT)(c))]


# ======================================= driver ===========================================

def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def prompt_key(turns: list[str]) -> str:
    return normalize(" | ".join(turns))


def shingles(turns: list[str], n: int = 3) -> frozenset:
    toks = normalize(" ".join(turns)).split()
    return frozenset(tuple(toks[i:i + n]) for i in range(max(1, len(toks) - n + 1)))


SLOT_LEFTOVER = re.compile(r"\{[a-z_]+(?:#\d)?\}")


def valid(category: str, turns: list[str]) -> bool:
    if category == "multi_turn" and len(turns) != 2:
        return False
    if category != "multi_turn" and len(turns) != 1:
        return False
    return all(t.strip() == t and t and len(t) <= MAX_CHARS and not SLOT_LEFTOVER.search(t) for t in turns)


class NearDupIndex:
    """Word 3-gram Jaccard against a reference set, with an inverted index for speed."""

    def __init__(self, prompts: list[list[str]] = ()):
        self.sets: list[frozenset] = []
        self.index: dict[tuple, list[int]] = {}
        for t in prompts:
            self.add(t)

    def add(self, turns: list[str]) -> None:
        sh = shingles(turns)
        for g in sh:
            self.index.setdefault(g, []).append(len(self.sets))
        self.sets.append(sh)

    def max_sim(self, turns: list[str]) -> float:
        """Exact max Jaccard: the shared-shingle count per candidate gives |A & B| directly."""
        sh = shingles(turns)
        shared = Counter(i for g in sh for i in self.index.get(g, ()))
        return max((k / (len(sh) + len(self.sets[i]) - k) for i, k in shared.items()), default=0.0)


def generate(split: str, per_category: int, reference: NearDupIndex | None = None) -> list[dict]:
    rows: list[dict] = []
    seen: set[str] = set()
    own = NearDupIndex()
    for category in CATEGORIES:
        templates = TEMPLATES[category][split]
        rng = random.Random(f"{SEED}:{split}:{category}")
        c = Ctx(split, rng)
        order = list(range(len(templates)))
        made, i, misses = 0, 0, 0
        while made < per_category:
            if i % len(templates) == 0:
                rng.shuffle(order)  # round-robin over templates keeps them balanced
            fn = templates[order[i % len(templates)]]
            i += 1
            for _ in range(40):
                turns = fn(c)
                if not valid(category, turns):
                    continue
                key = prompt_key(turns)
                if key in seen:
                    continue
                if reference is not None and reference.max_sim(turns) > NEAR_DUP_JACCARD:
                    continue
                if own.max_sim(turns) > INTRA_JACCARD[split]:
                    continue
                seen.add(key)
                own.add(turns)
                rows.append({"category": category, "turns": turns, "template": fn.__name__})
                made += 1
                break
            else:
                misses += 1
                if misses > 20 * per_category:
                    raise RuntimeError(f"{split}/{category}: templates exhausted")
    offset = HELDOUT_ID_OFFSET if split == "heldout" else 0
    TEMPLATE_USE[split] = Counter((r["category"], r["template"]) for r in rows)
    return [{"question_id": offset + n + 1, "category": r["category"], "turns": r["turns"]}
            for n, r in enumerate(rows)]


TEMPLATE_USE: dict[str, Counter] = {}  # (category, template name) -> prompts, filled by generate()


def build() -> tuple[list[dict], list[dict]]:
    train = generate("train", TRAIN_PER_CATEGORY)
    heldout = generate("heldout", HELDOUT_PER_CATEGORY, NearDupIndex([r["turns"] for r in train]))
    return train, heldout


def dumps(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def summary(train: list[dict], heldout: list[dict]) -> str:
    out = []
    for name, rows in (("train", train), ("heldout", heldout)):
        cats = Counter(r["category"] for r in rows)
        keys = [prompt_key(r["turns"]) for r in rows]
        lens = sorted(sum(len(t) for t in r["turns"]) for r in rows)
        out.append(f"{name}: {len(rows)} prompts, {len(set(keys))} unique; "
                   f"chars min/median/max = {lens[0]}/{lens[len(lens) // 2]}/{lens[-1]}")
        for cat in CATEGORIES:
            sub = sorted(sum(len(t) for t in r["turns"]) for r in rows if r["category"] == cat)
            use = [n for (c, _), n in TEMPLATE_USE.get(name, Counter()).items() if c == cat]
            out.append(f"  {cat:15s} {cats[cat]:5d}   templates={len(TEMPLATES[cat][name]):3d} "
                       f"(used {len(use)}, {min(use, default=0)}-{max(use, default=0)} prompts each)   "
                       f"chars {sub[0]}-{sub[-1]} (median {sub[len(sub) // 2]})")
    exact = {prompt_key(r["turns"]) for r in train} & {prompt_key(r["turns"]) for r in heldout}
    idx = NearDupIndex([r["turns"] for r in train])
    sims = sorted(idx.max_sim(r["turns"]) for r in heldout)
    out.append(f"exact train/heldout overlap: {len(exact)}")
    out.append(f"held-out max word-3-gram Jaccard vs train: max={sims[-1]:.3f} "
               f"median={sims[len(sims) // 2]:.3f} (threshold {NEAR_DUP_JACCARD})")
    for name, rows in (("train", train), ("heldout", heldout)):
        own, worst = NearDupIndex(), 0.0
        for r in rows:
            worst = max(worst, own.max_sim(r["turns"]))
            own.add(r["turns"])
        out.append(f"{name}: max word-3-gram Jaccard between two of its prompts = {worst:.3f} "
                   f"(limit {INTRA_JACCARD[name]})")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path, default=HERE)
    ap.add_argument("--check", action="store_true", help="verify the files on disk match a fresh build")
    ap.add_argument("--samples", type=int, default=0, help="print N random prompts from each file")
    args = ap.parse_args(argv)

    train, heldout = build()
    files = {"train.jsonl": dumps(train), "heldout.jsonl": dumps(heldout)}
    if args.check:
        bad = [n for n, text in files.items()
               if not (args.out_dir / n).exists() or (args.out_dir / n).read_text(encoding="utf-8") != text]
        print("OK: files are up to date" if not bad else f"out of date: {', '.join(bad)}")
        return 1 if bad else 0
    for n, text in files.items():
        (args.out_dir / n).write_text(text, encoding="utf-8", newline="\n")
    print(summary(train, heldout))
    for n in files:
        print(f"{n}: {(args.out_dir / n).stat().st_size:,} bytes")
    if args.samples:
        rng = random.Random()
        for name, rows in (("train", train), ("heldout", heldout)):
            for r in rng.sample(rows, min(args.samples, len(rows))):
                print(f"\n===== {name} #{r['question_id']} [{r['category']}]")
                for t in r["turns"]:
                    print(t if len(r["turns"]) == 1 else f"> {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
