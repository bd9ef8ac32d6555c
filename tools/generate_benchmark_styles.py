"""Generate ``benchmark_styles.jsonl``: 300 original prompts, 50 in each benchmark style.

Run from the repository root:  ``python src/blockcoupling/data/_generate_benchmark_styles.py``.
The output is deterministic (fixed seed); the JSONL beside this script is what ships, this
script documents how it was made. All items are written for this project in the *style* of
ARC, GSM8K, HellaSwag, MMLU, TruthfulQA and Winogrande; none is copied from those sets.

Formats (kept close to how lm-evaluation-harness prompts each benchmark):
- science (ARC-like): ``"Question: {q}\\n(A) .. (B) .. (C) .. (D) ..\\nAnswer:"``
- math (GSM8K-like): ``"Question: {word problem}\\nAnswer:"``
- commonsense (HellaSwag-like): ``"{activity}: {context that stops mid-sentence}"``
- multi_subject (MMLU-like): subject header, question, ``A.``-``D.`` choices, ``"Answer:"``
- truthfulness (TruthfulQA-like): ``"Q: {question about a common misconception}\\nA:"``
  (without the harness's six-shot preamble, to keep the prompts short)
- pronoun (Winogrande-like): ``"{sentence with a blank _}\\nOption 1: ..\\nOption 2: ..\\nAnswer:"``
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src/blockcoupling/prompts/data/benchmark_styles.jsonl"
SEED = 20250101

# --------------------------------------------------------------------------------------
# science (ARC-like): (question, correct answer, three distractors)
# --------------------------------------------------------------------------------------
SCIENCE: list[tuple[str, str, str, str, str]] = [
    (
        "Which property of a rock can a student test by scratching it with a steel nail?",
        "hardness",
        "color",
        "mass",
        "temperature",
    ),
    (
        "A glass of water is left on a sunny windowsill. After a week the water level is lower. "
        "Which process best explains this?",
        "evaporation",
        "condensation",
        "precipitation",
        "freezing",
    ),
    (
        "Which organ pumps blood through the human body?",
        "the heart",
        "the lungs",
        "the stomach",
        "the liver",
    ),
    (
        "Which gas do plants take in from the air to make their food?",
        "carbon dioxide",
        "oxygen",
        "helium",
        "hydrogen",
    ),
    (
        "A ball rolling across a carpet slowly comes to a stop. Which force causes it to stop?",
        "friction",
        "magnetism",
        "buoyancy",
        "static electricity",
    ),
    ("Which of these is a renewable source of energy?", "wind", "coal", "natural gas", "oil"),
    (
        "Which tool should a student use to measure the volume of a liquid?",
        "a graduated cylinder",
        "a thermometer",
        "a spring scale",
        "a hand lens",
    ),
    (
        "Why does the Moon seem to change shape over the course of a month?",
        "Its position relative to Earth and the Sun changes",
        "Clouds cover different parts of it",
        "It produces less light on some nights",
        "It shrinks and grows as it cools",
    ),
    (
        "Which layer of Earth is made mostly of liquid metal?",
        "the outer core",
        "the crust",
        "the inner core",
        "the upper mantle",
    ),
    (
        "A frog starts life as an egg and then becomes a tadpole before it grows legs. "
        "What is this series of changes called?",
        "metamorphosis",
        "photosynthesis",
        "erosion",
        "migration",
    ),
    (
        "Which of these materials is the best conductor of electricity?",
        "a copper wire",
        "a rubber band",
        "a wooden spoon",
        "a plastic ruler",
    ),
    (
        "What happens to the volume of water when it freezes into ice?",
        "It increases",
        "It decreases",
        "It stays exactly the same",
        "It drops to zero",
    ),
    (
        "Which of these is an inherited trait of a dog?",
        "the color of its fur",
        "a trick it has learned",
        "a scar on its leg",
        "the name its owner chose",
    ),
    (
        "Which gas makes up most of Earth's atmosphere?",
        "nitrogen",
        "oxygen",
        "carbon dioxide",
        "argon",
    ),
    (
        "Droplets form on the outside of a cold can taken from the refrigerator. "
        "Where does this water come from?",
        "water vapor in the surrounding air",
        "soda leaking through the metal",
        "the metal of the can melting",
        "the cold inside the can turning into water",
    ),
    (
        "What is the role of decomposers in an ecosystem?",
        "They break down dead matter and return nutrients to the soil",
        "They make food from sunlight",
        "They hunt larger animals",
        "They pollinate flowers",
    ),
    (
        "What causes day and night on Earth?",
        "Earth spinning on its axis",
        "Earth moving around the Sun",
        "the Moon moving around Earth",
        "the Sun moving around Earth",
    ),
    ("Which unit is used to measure force?", "the newton", "the liter", "the meter", "the kelvin"),
    (
        "A farmer plants a row of trees along the edge of a dry, open field. Which problem will "
        "the trees most likely reduce?",
        "soil erosion by wind",
        "acid rain",
        "earthquakes",
        "ocean tides",
    ),
    (
        "Which of these is a chemical change?",
        "an iron gate rusting",
        "ice melting",
        "paper being cut in half",
        "sugar dissolving in water",
    ),
    (
        "Which part of a plant cell captures energy from light?",
        "the chloroplast",
        "the cell wall",
        "the vacuole",
        "the nucleus",
    ),
    (
        "Fossil seashells are found near the top of a mountain. What does this most likely show?",
        "The area was once covered by water",
        "Birds carried the shells there",
        "The shells grew on the mountain",
        "The shells were formed by lightning",
    ),
    ("Which planet is closest to the Sun?", "Mercury", "Venus", "Mars", "Jupiter"),
    (
        "A student pushes a cart with twice as much force as before. If nothing else changes, "
        "what happens to the cart's acceleration?",
        "It doubles",
        "It is cut in half",
        "It stays the same",
        "It becomes zero",
    ),
    ("Which of these animals is a mammal?", "a whale", "a shark", "a salmon", "a turtle"),
    (
        "What is the main job of a plant's roots?",
        "to take in water and hold the plant in place",
        "to make seeds",
        "to catch sunlight",
        "to attract insects",
    ),
    (
        "Which type of rock forms when melted rock cools and hardens?",
        "igneous",
        "sedimentary",
        "metamorphic",
        "limestone",
    ),
    ("Sound travels fastest through which of these?", "steel", "air", "water vapor", "empty space"),
    (
        "Which process do cells use to release the energy stored in food?",
        "cellular respiration",
        "photosynthesis",
        "transpiration",
        "condensation",
    ),
    (
        "Which observation shows that a chemical reaction has most likely taken place?",
        "bubbles of gas form when two liquids are mixed",
        "a rubber band is stretched",
        "water is poured into a glass",
        "a chocolate bar melts in the sun",
    ),
    (
        "Which is the best way to save water at home?",
        "fixing a dripping faucet",
        "taking longer showers",
        "watering the lawn at noon",
        "running the dishwasher half empty",
    ),
    (
        "A magnet will attract which of these objects?",
        "an iron nail",
        "a copper coin",
        "a glass marble",
        "a wooden block",
    ),
    (
        "What is the original source of energy for most food chains on Earth?",
        "the Sun",
        "the soil",
        "the wind",
        "the ocean floor",
    ),
    (
        "A student wants to find out whether fertilizer helps bean plants grow taller. "
        "What should be different between the two groups of plants?",
        "the amount of fertilizer",
        "the type of bean",
        "the amount of water",
        "the size of the pot",
    ),
    (
        "Which statement describes weather rather than climate?",
        "It rained heavily this afternoon",
        "The region has dry summers every year",
        "Winters in the valley are usually mild",
        "The desert gets little rain over decades",
    ),
    (
        "Which organ of the human body breaks down food with acid?",
        "the stomach",
        "the heart",
        "the brain",
        "the kidneys",
    ),
    (
        "A metal spoon and a wooden spoon have been in the same room all day, yet the metal one "
        "feels colder to the touch. Why?",
        "Metal carries heat away from the hand faster",
        "Metal is always colder than wood",
        "Wood makes its own heat",
        "Metal absorbs more light",
    ),
    (
        "What happens when the Moon passes directly between the Sun and Earth?",
        "a solar eclipse",
        "a lunar eclipse",
        "a full moon",
        "a meteor shower",
    ),
    ("Which of these organisms is a producer?", "grass", "a rabbit", "a fox", "a hawk"),
    (
        "What happens to the particles of a substance when it is heated?",
        "They move faster",
        "They stop moving",
        "They become smaller",
        "They turn into different atoms",
    ),
    (
        "Which feature helps a cactus survive in the desert?",
        "a thick stem that stores water",
        "large thin leaves",
        "a need for daily rain",
        "bark that reflects all sunlight",
    ),
    (
        "Which instrument is used to measure air pressure?",
        "a barometer",
        "an anemometer",
        "a rain gauge",
        "a thermometer",
    ),
    (
        "A bulb in a simple circuit will not light. What is the most likely cause?",
        "There is a break in the circuit",
        "The wires are too short",
        "The battery is brand new",
        "The switch is closed",
    ),
    (
        "Why do we always see the same side of the Moon from Earth?",
        "The Moon turns once on its axis for every trip around Earth",
        "The Moon does not turn at all",
        "Earth's air hides the other side",
        "The Sun only ever lights one side",
    ),
    (
        "Which of these substances is a mixture?",
        "salt water",
        "pure gold",
        "oxygen gas",
        "distilled water",
    ),
    (
        "A wolf has long, pointed front teeth. What do these teeth help it do?",
        "tear meat",
        "grind grass",
        "crack seeds",
        "filter water",
    ),
    (
        "Which human activity adds the most carbon dioxide to the atmosphere?",
        "burning fossil fuels",
        "planting trees",
        "recycling paper",
        "using solar panels",
    ),
    (
        "In which state of matter do particles keep a fixed shape and volume?",
        "solid",
        "liquid",
        "gas",
        "vapor",
    ),
    (
        "Which landform can a river carve out over a very long time?",
        "a canyon",
        "a volcano",
        "a glacier",
        "a sand dune",
    ),
    (
        "Why do scientists repeat an experiment several times?",
        "to make the results more reliable",
        "to change the hypothesis",
        "to make the experiment shorter",
        "to avoid recording data",
    ),
]

# --------------------------------------------------------------------------------------
# multi_subject (MMLU-like): (subject, question, correct answer, three distractors)
# --------------------------------------------------------------------------------------
MMLU: list[tuple[str, str, str, str, str, str]] = [
    (
        "high_school_biology",
        "Which organelle is the site of protein synthesis?",
        "ribosome",
        "mitochondrion",
        "Golgi apparatus",
        "lysosome",
    ),
    (
        "high_school_biology",
        "Two pea plants that are both heterozygous for height (Tt) are "
        "crossed. What fraction of the offspring is expected to be homozygous recessive?",
        "1/4",
        "1/2",
        "3/4",
        "0",
    ),
    (
        "high_school_biology",
        "Which molecule brings amino acids to the ribosome during translation?",
        "transfer RNA",
        "messenger RNA",
        "DNA polymerase",
        "ATP synthase",
    ),
    (
        "high_school_chemistry",
        "What is the pH of pure water at 25 degrees Celsius?",
        "7",
        "0",
        "1",
        "14",
    ),
    (
        "high_school_chemistry",
        "How many moles of water form when 2 moles of hydrogen gas react "
        "completely with excess oxygen?",
        "2",
        "1",
        "4",
        "0.5",
    ),
    (
        "high_school_chemistry",
        "Which kind of bond forms when two nonmetal atoms share electrons?",
        "covalent",
        "ionic",
        "metallic",
        "hydrogen",
    ),
    (
        "high_school_physics",
        "A car speeds up uniformly from rest to 20 m/s in 5 s. What is its acceleration?",
        "4 m/s^2",
        "100 m/s^2",
        "0.25 m/s^2",
        "25 m/s^2",
    ),
    (
        "high_school_physics",
        "What is the SI unit of electrical resistance?",
        "ohm",
        "volt",
        "ampere",
        "watt",
    ),
    (
        "high_school_physics",
        "An object is dropped from rest near Earth's surface. Ignoring air "
        "resistance, about how fast is it falling after 2 seconds?",
        "20 m/s",
        "5 m/s",
        "10 m/s",
        "40 m/s",
    ),
    ("elementary_mathematics", "What is 3/4 written as a percentage?", "75%", "34%", "43%", "80%"),
    (
        "elementary_mathematics",
        "What is the least common multiple of 6 and 8?",
        "24",
        "48",
        "14",
        "2",
    ),
    (
        "elementary_mathematics",
        "A rectangle is 9 cm long and 4 cm wide. What is its area?",
        "36 square cm",
        "13 square cm",
        "26 square cm",
        "18 square cm",
    ),
    (
        "high_school_mathematics",
        "What are the solutions of x^2 - 5x + 6 = 0?",
        "x = 2 and x = 3",
        "x = -2 and x = -3",
        "x = 1 and x = 6",
        "x = -1 and x = 6",
    ),
    (
        "high_school_mathematics",
        "What is the slope of the line through the points (1, 2) and (3, 8)?",
        "3",
        "2",
        "6",
        "1/3",
    ),
    ("high_school_mathematics", "If f(x) = 2x + 3, what is f(f(1))?", "13", "5", "10", "8"),
    (
        "college_mathematics",
        "What is the derivative of x sin(x)?",
        "sin(x) + x cos(x)",
        "cos(x)",
        "x cos(x)",
        "sin(x) - x cos(x)",
    ),
    (
        "college_mathematics",
        "What is the determinant of the matrix [[2, 1], [4, 3]]?",
        "2",
        "10",
        "-2",
        "6",
    ),
    (
        "college_mathematics",
        "How many subsets does a set with 5 elements have?",
        "32",
        "25",
        "10",
        "120",
    ),
    (
        "high_school_computer_science",
        "What is the worst-case running time of binary search on a sorted list of n items?",
        "O(log n)",
        "O(n)",
        "O(n log n)",
        "O(n^2)",
    ),
    (
        "high_school_computer_science",
        "Which data structure removes the most recently added item first?",
        "a stack",
        "a queue",
        "a binary search tree",
        "a hash table",
    ),
    (
        "high_school_computer_science",
        "What is the decimal value of the binary number 1011?",
        "11",
        "13",
        "9",
        "10",
    ),
    (
        "high_school_world_history",
        "Who developed a printing press with movable metal type in fifteenth-century Europe?",
        "Johannes Gutenberg",
        "Galileo Galilei",
        "Martin Luther",
        "Leonardo da Vinci",
    ),
    (
        "high_school_world_history",
        "Which empire ruled from the city of Cusco?",
        "the Inca",
        "the Aztec",
        "the Ottoman",
        "the Mughal",
    ),
    (
        "high_school_world_history",
        "The Silk Road mainly linked which two regions?",
        "China and the Mediterranean world",
        "Scandinavia and West Africa",
        "Australia and India",
        "Mexico and Peru",
    ),
    (
        "high_school_us_history",
        "Which document of 1776 announced that the thirteen American "
        "colonies were separating from Great Britain?",
        "the Declaration of Independence",
        "the Constitution",
        "the Bill of Rights",
        "the Articles of Confederation",
    ),
    (
        "high_school_us_history",
        "From which country did the United States buy the Louisiana Territory in 1803?",
        "France",
        "Spain",
        "Britain",
        "Mexico",
    ),
    (
        "high_school_geography",
        "Which is the longest river in South America?",
        "the Amazon",
        "the Parana",
        "the Orinoco",
        "the Magdalena",
    ),
    (
        "high_school_geography",
        "Which line of latitude divides Earth into the Northern and Southern Hemispheres?",
        "the equator",
        "the prime meridian",
        "the Tropic of Cancer",
        "the Arctic Circle",
    ),
    (
        "high_school_geography",
        "On which continent is most of the Sahara?",
        "Africa",
        "Asia",
        "Australia",
        "South America",
    ),
    (
        "high_school_macroeconomics",
        "What is the most likely short-run effect of a central bank raising interest rates?",
        "Borrowing decreases",
        "Borrowing increases",
        "Prices rise sharply",
        "Unemployment falls at once",
    ),
    (
        "high_school_macroeconomics",
        "What does gross domestic product measure?",
        "the market value of all final goods and services produced in a country in a period",
        "total government spending in a year",
        "the amount of money in circulation",
        "the value of a country's exports",
    ),
    (
        "high_school_microeconomics",
        "All else equal, what usually happens to the quantity "
        "demanded of a good when its price rises?",
        "It falls",
        "It rises",
        "It stays the same",
        "It doubles",
    ),
    (
        "high_school_microeconomics",
        "What is a cost called that has already been paid and cannot be recovered?",
        "a sunk cost",
        "an opportunity cost",
        "a marginal cost",
        "a variable cost",
    ),
    (
        "philosophy",
        "Which philosopher argued 'I think, therefore I am'?",
        "Rene Descartes",
        "David Hume",
        "Immanuel Kant",
        "John Locke",
    ),
    (
        "philosophy",
        "Utilitarianism judges an action mainly by what?",
        "its consequences for overall well-being",
        "the intentions of the agent alone",
        "whether it follows tradition",
        "whether it benefits the agent",
    ),
    (
        "formal_logic",
        "What is an argument called whose conclusion must be true whenever its premises are true?",
        "valid",
        "inductive",
        "fallacious",
        "rhetorical",
    ),
    (
        "high_school_psychology",
        "In classical conditioning, what is a once-neutral stimulus "
        "that comes to trigger a response called?",
        "a conditioned stimulus",
        "an unconditioned stimulus",
        "a reinforcer",
        "a punisher",
    ),
    (
        "high_school_psychology",
        "Which part of the brain is most involved in forming new long-term memories?",
        "the hippocampus",
        "the cerebellum",
        "the medulla",
        "the occipital lobe",
    ),
    (
        "astronomy",
        "What is the main source of the energy the Sun gives off?",
        "nuclear fusion of hydrogen into helium",
        "burning of carbon",
        "nuclear fission of uranium",
        "friction between gas clouds",
    ),
    (
        "astronomy",
        "Which planet in our solar system has the most prominent rings?",
        "Saturn",
        "Mars",
        "Mercury",
        "Venus",
    ),
    (
        "nutrition",
        "Which vitamin does human skin make when exposed to sunlight?",
        "vitamin D",
        "vitamin C",
        "vitamin A",
        "vitamin K",
    ),
    (
        "nutrition",
        "Which nutrient is the body's main source of quick energy?",
        "carbohydrates",
        "vitamins",
        "minerals",
        "water",
    ),
    ("anatomy", "How many chambers does the human heart have?", "four", "two", "three", "six"),
    (
        "anatomy",
        "Which is the longest bone in the human body?",
        "the femur",
        "the tibia",
        "the humerus",
        "the radius",
    ),
    (
        "business_ethics",
        "A firm that weighs the interests of employees, customers and local "
        "communities as well as owners is following which view?",
        "stakeholder theory",
        "shareholder primacy",
        "mercantilism",
        "laissez-faire",
    ),
    (
        "marketing",
        "What is dividing a market into groups of buyers with similar needs called?",
        "market segmentation",
        "vertical integration",
        "outsourcing",
        "depreciation",
    ),
    (
        "high_school_government_and_politics",
        "Which branch of the United States government interprets the laws?",
        "the judicial branch",
        "the legislative branch",
        "the executive branch",
        "the electoral college",
    ),
    (
        "high_school_government_and_politics",
        "How many senators does each U.S. state elect?",
        "two",
        "one",
        "four",
        "a number based on its population",
    ),
    (
        "electrical_engineering",
        "What current flows through a 10-ohm resistor with 5 volts across it?",
        "0.5 A",
        "2 A",
        "50 A",
        "15 A",
    ),
    (
        "logical_fallacies",
        "What is it called when someone attacks the person making an "
        "argument instead of the argument itself?",
        "ad hominem",
        "straw man",
        "slippery slope",
        "false dilemma",
    ),
]

# --------------------------------------------------------------------------------------
# commonsense (HellaSwag-like): (activity label, context that stops mid-sentence)
# --------------------------------------------------------------------------------------
COMMONSENSE: list[tuple[str, str]] = [
    (
        "Making a sandwich",
        "A man lays two slices of bread on a cutting board. He spreads "
        "butter on one slice and then",
    ),
    (
        "Washing a car",
        "A woman fills a bucket with soapy water and carries it to the "
        "driveway. She dips a sponge into the bucket and",
    ),
    (
        "Tying shoes",
        "A young boy sits on the front steps and pulls on his sneakers. He "
        "crosses the laces over each other and",
    ),
    (
        "Painting a fence",
        "Two teenagers stand beside a wooden fence holding brushes. One of "
        "them pries open a can of white paint and",
    ),
    (
        "Playing the guitar",
        "A man sits on a stool with an acoustic guitar resting on his "
        "knee. He tunes the top string and",
    ),
    (
        "Brushing teeth",
        "A little girl stands on a stool in front of the bathroom sink. She "
        "squeezes toothpaste onto her brush and",
    ),
    (
        "Shoveling snow",
        "A man in a heavy coat steps out onto a driveway covered in snow. He "
        "grips the shovel with both hands and",
    ),
    (
        "Baking cookies",
        "A woman rolls a ball of dough between her palms and sets it on a "
        "baking tray. When the tray is full, she",
    ),
    (
        "Walking the dog",
        "A woman clips a leash onto her dog's collar by the front door. The "
        "dog jumps around excitedly, and she",
    ),
    (
        "Changing a tire",
        "A man kneels beside his car on the shoulder of the road. He loosens "
        "the nuts on the flat tire and then",
    ),
    (
        "Ironing clothes",
        "A woman lays a wrinkled shirt flat across the ironing board. She "
        "checks the setting on the iron and",
    ),
    (
        "Kayaking",
        "Two friends push a kayak off the sandy shore into the calm lake. They "
        "climb in carefully and",
    ),
    (
        "Making coffee",
        "A man pours fresh water into the back of a coffee maker. He spoons "
        "ground coffee into the filter and",
    ),
    (
        "Planting flowers",
        "A girl digs a small hole in the flower bed with a trowel. She "
        "slides a seedling out of its plastic pot and",
    ),
    (
        "Wrapping a gift",
        "A man cuts a sheet of striped paper and sets a box in the middle of "
        "it. He folds the edges up around the box and",
    ),
    (
        "Juggling",
        "A street performer stands in a park holding three red balls. He tosses the "
        "first ball into the air and",
    ),
    (
        "Cleaning windows",
        "A woman sprays glass cleaner onto the big living room window. She "
        "picks up a dry cloth and",
    ),
    (
        "Skateboarding",
        "A teenager rolls across an empty parking lot on his skateboard. He "
        "bends his knees, snaps the tail of the board down, and",
    ),
    (
        "Doing laundry",
        "A man carries a basket of dirty clothes into the laundry room. He "
        "sorts the whites from the colors and",
    ),
    (
        "Chopping vegetables",
        "A cook places an onion on a wooden board and slices off both "
        "ends. He peels away the papery skin and",
    ),
    (
        "Swimming",
        "A girl in goggles stands at the edge of the pool. She curls her toes over "
        "the edge, dives into the water and",
    ),
    (
        "Building a snowman",
        "Three children roll a ball of snow across the yard until it is "
        "almost as tall as they are. Then they",
    ),
    (
        "Fishing",
        "An old man sits at the end of a wooden dock with a fishing rod. He feels a "
        "sharp tug on the line and",
    ),
    (
        "Mowing the lawn",
        "A man pulls the cord on a lawn mower and the engine sputters to "
        "life. He pushes it slowly across the grass and",
    ),
    (
        "Applying makeup",
        "A woman sits in front of a lit mirror and opens a small case. She "
        "dabs foundation onto her cheeks and",
    ),
    (
        "Rock climbing",
        "A climber chalks her hands at the base of an indoor climbing wall. "
        "She reaches up for the first hold and",
    ),
    (
        "Setting the table",
        "A boy places a plate in front of each chair at the kitchen "
        "table. Next, he sets a fork beside each plate and",
    ),
    (
        "Grooming a horse",
        "A girl leads a brown horse into the stable and ties it to a post. "
        "She picks up a stiff brush and",
    ),
    (
        "Playing basketball",
        "A group of friends shoot hoops at an outdoor court. One of them "
        "dribbles past a defender toward the basket and",
    ),
    (
        "Sewing a button",
        "A woman threads a needle and ties a knot at the end of the thread. "
        "She holds the button against the shirt and",
    ),
    (
        "Washing dishes",
        "A man fills the sink with warm water and dish soap. He scrubs a "
        "greasy pan with a sponge and then",
    ),
    (
        "Riding a bike",
        "A little boy wobbles along on his new bicycle while his father holds "
        "the seat. The father lets go and",
    ),
    (
        "Making a bed",
        "A woman stretches the fitted sheet over the corners of the mattress. "
        "She shakes out a blanket and",
    ),
    (
        "Flying a kite",
        "Two kids run across a windy field holding the string of a kite. The "
        "kite catches a gust and",
    ),
    (
        "Carving a pumpkin",
        "A girl cuts a circle around the stem of a large pumpkin. She lifts off the lid and",
    ),
    (
        "Cleaning a fish tank",
        "A man unplugs the filter and scoops the fish into a small bowl. "
        "He siphons out some of the old water and",
    ),
    (
        "Decorating a cake",
        "A baker spreads a thin layer of frosting over a round cake. She "
        "fills a piping bag with pink icing and",
    ),
    (
        "Vacuuming",
        "A teenager plugs in the vacuum cleaner in the living room. He pushes the "
        "coffee table aside and",
    ),
    (
        "Surfing",
        "A surfer paddles out past the breaking waves on her board. She spots a large "
        "wave rolling in and",
    ),
    (
        "Shaving",
        "A man spreads shaving cream over his chin and cheeks. He rinses the razor "
        "under the tap and",
    ),
    (
        "Packing a suitcase",
        "A woman lays an open suitcase on the bed. She rolls her shirts up tightly and",
    ),
    (
        "Bowling",
        "A man lifts a heavy ball from the rack and steps up to the lane. He swings "
        "his arm back and",
    ),
    (
        "Hanging a picture",
        "A woman holds a framed photo against the wall while her friend "
        "marks the spot with a pencil. The friend then",
    ),
    (
        "Grilling burgers",
        "A man lights the grill in the backyard and waits for it to heat "
        "up. He lays four patties on the grate and",
    ),
    (
        "Jumping rope",
        "A girl swings a rope over her head on the playground. She hops over it "
        "each time it reaches her feet and",
    ),
    (
        "Raking leaves",
        "A family works in a yard covered with orange leaves. The father rakes "
        "them into a big pile, and the children",
    ),
    (
        "Knitting",
        "An elderly woman sits in a rocking chair with a ball of blue yarn in her "
        "lap. She loops the yarn around one needle and",
    ),
    (
        "Polishing shoes",
        "A man sets a pair of black leather shoes on a sheet of newspaper. He "
        "dabs polish onto a soft cloth and",
    ),
    (
        "Pitching a tent",
        "Two campers unfold a tent on a flat patch of ground. They slide the "
        "poles through the sleeves and",
    ),
    (
        "Playing the piano",
        "A young woman sits down at a piano on a small stage and adjusts "
        "the bench. She rests her hands on the keys and",
    ),
]

# --------------------------------------------------------------------------------------
# truthfulness (TruthfulQA-like): questions that invite a popular misconception
# --------------------------------------------------------------------------------------
TRUTHFULNESS: list[str] = [
    "Do goldfish really forget everything after a few seconds?",
    "What happens to a piece of chewing gum after you swallow it?",
    "Is it dangerous to wake up someone who is sleepwalking?",
    "Does shaving make hair grow back thicker and darker?",
    "Do bulls charge at matadors because the cape is red?",
    "Is it risky to go swimming right after a big lunch?",
    "Do humans have only five senses?",
    "Does eating sugar make children hyperactive?",
    "Was Napoleon Bonaparte unusually short for a man of his time?",
    "What color is the blood in your veins before it is exposed to air?",
    "Are bats completely blind?",
    "Can lightning strike the same place more than once?",
    "Is the tongue divided into separate zones for sweet, sour, salty and bitter tastes?",
    "Do people lose most of their body heat through their heads?",
    "Could a coin dropped from the top of a skyscraper kill someone on the sidewalk?",
    "Did Viking warriors wear helmets with horns on them?",
    "Is Mount Everest the tallest mountain on Earth when measured from base to peak?",
    "Do ostriches bury their heads in the sand when they are frightened?",
    "Does breaking a mirror bring seven years of bad luck?",
    "Is food that falls on the floor safe to eat if you pick it up within five seconds?",
    "Does reading in dim light permanently damage your eyes?",
    "Did most educated people in medieval Europe believe that the Earth was flat?",
    "Is window glass a liquid that slowly flows over the centuries?",
    "Do camels store water in their humps?",
    "What color is the Sun when it is seen from space?",
    "Can you catch a cold just by going outside with wet hair?",
    "Was Albert Einstein bad at mathematics when he was in school?",
    "Do chameleons change color mainly to blend in with their surroundings?",
    "Does drinking alcohol warm up your body when you are cold?",
    "Do dogs see the world only in black and white?",
    "Do hair and fingernails keep growing after a person dies?",
    "Does the Moon have a dark side that never receives any sunlight?",
    "Does cooking food in a microwave oven make it radioactive?",
    "Does water always drain in opposite directions in the Northern and Southern Hemispheres?",
    "Is it illegal in every U.S. state to drive a car barefoot?",
    "Did Thomas Edison invent the very first electric light bulb?",
    "Are daddy longlegs the most venomous spiders in the world?",
    "Is summer caused by Earth being closer to the Sun?",
    "Can porcupines shoot their quills at an attacker?",
    "Do bananas grow on trees?",
    "Does hot water always freeze faster than cold water?",
    "Is Pluto still officially classified as a planet?",
    "Will a mother bird abandon her chick if a human has touched it?",
    "Did all the signers put their names on the Declaration of Independence on July 4, 1776?",
    "Are all deserts hot?",
    "Is it safe to look straight at the Sun during a partial eclipse?",
    "Does being left-brained or right-brained determine a person's personality?",
    "Do antibiotics cure infections caused by viruses?",
    "Do elephants drink water through their trunks the way people use a straw?",
    "Does cracking your neck or back cause arthritis later in life?",
]

# --------------------------------------------------------------------------------------
# pronoun (Winogrande-like): twin sentences; the trigger word decides the answer
# --------------------------------------------------------------------------------------
# person templates: (sentence with {a} {b} and the trigger slot {t}, twin triggers) ;
# the options are always the two names
PERSON_TWINS: list[tuple[str, str, str]] = [
    (
        "{a} asked {b} for help with the fractions homework because _ {t} the lesson.",
        "had missed",
        "had paid close attention in",
    ),
    ("{a} gave {b} a ride to the airport because _ {t}.", "owned a car", "did not own a car"),
    (
        "{a} was jealous of {b}'s vegetable garden, since _ {t} huge tomatoes.",
        "could never grow",
        "always grew",
    ),
    (
        "{a} always loses to {b} at chess, so _ {t}.",
        "has started taking lessons",
        "offered to give some lessons",
    ),
    (
        "{a} lent {b} a warm sweater because _ {t}.",
        "had packed an extra one",
        "was shivering after the walk in the rain",
    ),
    (
        "{a} finished the marathon but {b} did not, because _ had {t}.",
        "trained for months",
        "skipped most of the training runs",
    ),
    (
        "{a} called {b} to apologize, since _ had {t} their lunch date.",
        "forgotten about",
        "waited an hour alone at",
    ),
    (
        "{a} taught {b} how to bake bread, because _ had {t}.",
        "worked in a bakery for years",
        "never baked anything before",
    ),
    (
        "{a} had to wait for {b} at the station because _ {t}.",
        "arrived on the early train",
        "missed the early train",
    ),
    (
        "{a} paid for {b}'s dinner because _ had {t}.",
        "just received a bonus",
        "left a wallet at home",
    ),
    (
        "{a} is much taller than {b}, so _ {t} the top shelf.",
        "can easily reach",
        "needs a stool to reach",
    ),
    ("{a} sent {b} a thank-you card because _ had {t} a thoughtful gift.", "received", "given"),
    (
        "{a} could not understand {b}'s accent, because _ {t}.",
        "had never traveled outside the village",
        "had grown up on another continent",
    ),
    ("{a} tutored {b} in Spanish since _ was {t}.", "fluent in it", "struggling in class"),
    (
        "{a} woke {b} up at dawn because _ {t}.",
        "was an early riser",
        "had overslept and was late for work",
    ),
]

# object templates: (sentence with trigger slot {t}, option 1, option 2, trigger for option 1,
# trigger for option 2)
OBJECT_TWINS: list[tuple[str, str, str, str, str]] = [
    (
        "The bookshelf would not fit through the doorway because the _ was too {t}.",
        "bookshelf",
        "doorway",
        "wide",
        "narrow",
    ),
    (
        "The ice cream melted before the popsicle did because the _ was {t}.",
        "ice cream",
        "popsicle",
        "left out in the sun",
        "kept in the cooler",
    ),
    (
        "She swapped her sandals for boots because the _ were {t} for the snowy walk.",
        "sandals",
        "boots",
        "too cold",
        "much warmer",
    ),
    (
        "The glass broke when it fell on the tiles, but the cup survived, because the _ was "
        "made of {t}.",
        "glass",
        "cup",
        "thin crystal",
        "sturdy plastic",
    ),
    (
        "He rides his bicycle to work instead of driving his car because the _ is {t}.",
        "bicycle",
        "car",
        "faster through the city",
        "always stuck in traffic",
    ),
    (
        "The fern grew faster than the cactus because the _ was watered {t}.",
        "fern",
        "cactus",
        "every day",
        "only once a month",
    ),
    (
        "We moved the meeting from the office to the library because the _ was {t}.",
        "office",
        "library",
        "too noisy",
        "much quieter",
    ),
    (
        "The laptop died before the phone did because the _ {t}.",
        "laptop",
        "phone",
        "had an old, worn-out battery",
        "had been charged all night",
    ),
    (
        "The river flooded the town but not the farm, because the _ sits {t}.",
        "town",
        "farm",
        "on low ground",
        "high up on a hill",
    ),
    (
        "I could not pour the honey into the jar because the _ was too {t}.",
        "honey",
        "jar",
        "cold and thick",
        "small",
    ),
]

FEMALE = [
    "Maria",
    "Aisha",
    "Elena",
    "Priya",
    "Grace",
    "Sofia",
    "Hannah",
    "Mei",
    "Laura",
    "Fatima",
    "Chloe",
    "Amara",
    "Nadia",
    "Rosa",
    "Ingrid",
    "Yuki",
    "Leila",
    "Zoe",
]
MALE = [
    "James",
    "Kwame",
    "Luis",
    "Omar",
    "Daniel",
    "Hiroshi",
    "Ivan",
    "Samuel",
    "Arjun",
    "Pedro",
    "Noah",
    "Tariq",
    "Felix",
    "Ethan",
    "Mateo",
    "Jonas",
    "Kofi",
    "Ravi",
]


def _pair(rng: random.Random) -> tuple[str, str]:
    """Two distinct names of the same gender (so the pronoun blank is not a giveaway)."""
    pool = FEMALE if rng.random() < 0.5 else MALE
    a, b = rng.sample(pool, 2)
    return a, b


def _pronoun_prompts(rng: random.Random) -> list[str]:
    out: list[str] = []
    for template, t1, t2 in PERSON_TWINS:
        for trigger in (t1, t2):
            a, b = _pair(rng)
            sentence = template.format(a=a, b=b, t=trigger)
            out.append(f"{sentence}\nOption 1: {a}\nOption 2: {b}\nAnswer:")
    for template, o1, o2, t1, t2 in OBJECT_TWINS:
        for trigger in (t1, t2):
            sentence = template.format(t=trigger)
            out.append(f"{sentence}\nOption 1: {o1}\nOption 2: {o2}\nAnswer:")
    return out


# --------------------------------------------------------------------------------------
# math (GSM8K-like): templates with seeded names and numbers (consistent, whole answers)
# --------------------------------------------------------------------------------------
def _person(rng: random.Random) -> dict[str, str]:
    if rng.random() < 0.5:
        return {"n": rng.choice(FEMALE), "p": "she", "P": "She", "o": "her", "s": "her"}
    return {"n": rng.choice(MALE), "p": "he", "P": "He", "o": "him", "s": "his"}


def _math_templates() -> list[Callable[[random.Random], str]]:  # noqa: C901 - a flat list of template families
    def t1(r: random.Random) -> str:
        x = _person(r)
        a, b, c = r.randint(5, 30), r.randint(2, 6), r.choice([4, 5, 6, 8, 10, 12])
        return (
            f"{x['n']} has {a} stickers. {x['P']} buys {b} more packs with {c} stickers "
            f"in each pack. How many stickers does {x['n']} have now?"
        )

    def t2(r: random.Random) -> str:
        b = r.randint(10, 40)
        a = b + 2 * r.randint(15, 60)
        return (
            f"A bakery bakes {a} loaves of bread every morning. It sells {b} loaves before "
            "noon and half of the remaining loaves in the afternoon. How many loaves are "
            "left at the end of the day?"
        )

    def t3(r: random.Random) -> str:
        x = _person(r)
        a = r.randint(12, 40)
        total = 3 * a + r.randint(20, 150)
        return (
            f"{x['n']} reads {a} pages of a novel on Monday and twice as many pages on "
            f"Tuesday. If the novel has {total} pages, how many pages does {x['p']} still "
            "have to read?"
        )

    def t4(r: random.Random) -> str:
        rows, per = r.randint(8, 14), r.choice([2, 3, 4])
        on = r.randint(5, rows * per - 3)
        return (
            f"A school bus has {rows} rows of seats, and each row holds {per} students. "
            f"If {on} students are already on the bus, how many more students can get on?"
        )

    def t5(r: random.Random) -> str:
        x = _person(r)
        rate, h = r.choice([8, 10, 12, 15]), r.randint(4, 12)
        spend = r.randint(10, rate * h - 5)
        return (
            f"{x['n']} earns ${rate} an hour babysitting. Last week {x['p']} babysat for "
            f"{h} hours and then spent ${spend} on a new pair of shoes. How much of "
            f"{x['s']} babysitting money does {x['p']} have left?"
        )

    def t6(r: random.Random) -> str:
        x = _person(r)
        k = r.choice([5, 6, 7, 8])
        a = k * r.randint(3, 7) + r.randint(1, k - 1)
        return (
            f"A recipe for one apple pie needs {k} apples. {x['n']} has {a} apples. How "
            f"many whole pies can {x['p']} bake, and how many apples will be left over?"
        )

    def t7(r: random.Random) -> str:
        x = _person(r)
        length, width = r.randint(6, 25), r.randint(3, 15)
        return (
            f"A vegetable garden is {length} meters long and {width} meters wide. "
            f"{x['n']} wants to put a fence around the whole garden. How many meters of "
            f"fencing does {x['p']} need?"
        )

    def t8(r: random.Random) -> str:
        x = _person(r)
        s = r.choice([5, 10, 15, 20, 25])
        cost = s * r.randint(8, 30)
        return (
            f"{x['n']} saves ${s} every week. How many weeks will it take {x['o']} to save "
            f"enough for a bicycle that costs ${cost}?"
        )

    def t9(r: random.Random) -> str:
        v, t, v2, t2 = (
            r.choice([60, 70, 80, 90]),
            r.randint(2, 4),
            r.choice([50, 100, 120]),
            r.randint(1, 3),
        )
        return (
            f"A train travels at {v} kilometers per hour for {t} hours and then at {v2} "
            f"kilometers per hour for {t2} more hours. How far does the train travel in "
            "total?"
        )

    def t10(r: random.Random) -> str:
        x = _person(r)
        n, p, b = r.randint(2, 6), r.randint(2, 5), r.randint(15, 35)
        bill = 50 if n * p + b < 50 else 100
        return (
            f"{x['n']} bought {n} notebooks for ${p} each and a backpack for ${b}. "
            f"{x['P']} paid with a ${bill} bill. How much change did {x['p']} get?"
        )

    def t11(r: random.Random) -> str:
        n = r.choice([20, 25, 30, 40])
        pct = r.choice([10, 20, 40, 60]) if n != 25 else r.choice([20, 40, 60, 80])
        return (
            f"In a class of {n} students, {pct}% of the students walk to school and the "
            "rest take the bus. How many students take the bus?"
        )

    def t12(r: random.Random) -> str:
        x = _person(r)
        a, k, y = r.randint(8, 12), r.choice([5, 6]), r.randint(2, 10)
        return (
            f"{x['n']} is {a} years old. {x['s'].capitalize()} grandmother is {k} times "
            f"as old as {x['o']}. How old will {x['s']} grandmother be in {y} years?"
        )

    def t13(r: random.Random) -> str:
        c, g = r.randint(5, 30), r.randint(2, 12)
        return (
            f"A farmer has {c} chickens and {g} goats. How many legs do the farmer's "
            "animals have altogether?"
        )

    def t14(r: random.Random) -> str:
        k = r.choice([10, 12, 24])
        n = k * r.randint(2, 5) + r.randint(1, k - 1)
        return (
            f"A store sells pencils in boxes of {k}. A teacher needs {n} pencils for her "
            "class. How many boxes does the teacher have to buy?"
        )

    def t15(r: random.Random) -> str:
        x = _person(r)
        a, b = r.randint(3, 9), r.randint(3, 9)
        c = r.randint(3, 12)
        c += (-(a + b + c)) % 3
        return (
            f"{x['n']} ran {a} kilometers on Monday, {b} kilometers on Wednesday and {c} "
            f"kilometers on Friday. On average, how many kilometers did {x['p']} run on "
            "each of those days?"
        )

    def t16(r: random.Random) -> str:
        x, y = _person(r), _person(r)
        while y["n"] == x["n"]:
            y = _person(r)
        s = r.choice([8, 10, 12])
        a, b = r.randint(1, 3), r.randint(1, 3)
        return (
            f"A pizza is cut into {s} equal slices. {x['n']} eats {a} slices and "
            f"{y['n']} eats {b} slices. What fraction of the pizza is left?"
        )

    def t17(r: random.Random) -> str:
        rate = r.choice([4, 5, 8, 10])
        cap = 2 * rate * r.randint(10, 40)
        return (
            f"A water tank holds {cap} liters. A hose fills it at {rate} liters per minute. "
            "If the tank starts empty, how many minutes will it take to fill it halfway?"
        )

    def t18(r: random.Random) -> str:
        x, y = _person(r), _person(r)
        while y["n"] == x["n"]:
            y = _person(r)
        a = 3 * r.randint(6, 20)
        b = r.randint(1, a // 3)
        return (
            f"{x['n']} has {a} marbles. {x['P']} gives a third of them to {y['n']} and "
            f"then loses {b} more at the park. How many marbles does {x['n']} have left?"
        )

    def t19(r: random.Random) -> str:
        t, c = r.choice([9, 11, 12, 14]), r.choice([5, 6, 7])
        na, nc = r.randint(1, 3), r.randint(2, 5)
        return (
            f"A movie ticket costs ${t} for an adult and ${c} for a child. How much does "
            f"it cost for {na} adults and {nc} children to see the movie?"
        )

    def t20(r: random.Random) -> str:
        x = _person(r)
        rows, per, tom = r.randint(3, 8), r.randint(4, 10), r.randint(5, 15)
        return (
            f"{x['n']} plants {rows} rows of tomato plants with {per} plants in each row. "
            f"Each plant produces {tom} tomatoes. How many tomatoes does {x['p']} harvest?"
        )

    def t21(r: random.Random) -> str:
        p, d = r.choice([20, 30, 40, 50, 60, 80]), r.choice([10, 20, 25, 50])
        return (
            f"A jacket normally costs ${p}. This week it is on sale for {d}% off. How much "
            "does the jacket cost during the sale?"
        )

    def t22(r: random.Random) -> str:
        x = _person(r)
        h, d, w = r.randint(4, 9), r.randint(3, 6), r.randint(2, 8)
        return (
            f"{x['n']} works {h} hours a day, {d} days a week. How many hours does "
            f"{x['p']} work in {w} weeks?"
        )

    def t23(r: random.Random) -> str:
        a, b = r.randint(300, 900), r.randint(20, 150)
        c = r.randint(10, 100)
        return (
            f"A small library had {a} books. It received a donation of {b} books and then "
            f"gave away {c} old books. How many books does the library have now?"
        )

    def t24(r: random.Random) -> str:
        x = _person(r)
        k = r.choice([12, 15, 20])
        n = k * r.randint(4, 12) + r.randint(0, k - 1)
        p = r.choice([3, 4, 5, 6])
        return (
            f"{x['n']} makes bracelets that use {k} beads each, and {x['p']} has {n} "
            f"beads. {x['P']} makes as many bracelets as possible and sells each one for "
            f"${p}. How much money does {x['p']} make?"
        )

    def t25(r: random.Random) -> str:
        x = _person(r)
        m, k = r.randint(6, 15), r.choice([2, 3])
        return (
            f"It takes {x['n']} {m} minutes to walk to the park and {k} times as long to "
            f"walk to the museum. If {x['p']} walks to the museum and back home, how many "
            f"minutes does {x['p']} spend walking?"
        )

    return [
        t1,
        t2,
        t3,
        t4,
        t5,
        t6,
        t7,
        t8,
        t9,
        t10,
        t11,
        t12,
        t13,
        t14,
        t15,
        t16,
        t17,
        t18,
        t19,
        t20,
        t21,
        t22,
        t23,
        t24,
        t25,
    ]


# --------------------------------------------------------------------------------------
# assembly
# --------------------------------------------------------------------------------------
def _mc_science(rng: random.Random, q: str, right: str, *wrong: str) -> str:
    choices = [right, *wrong]
    rng.shuffle(choices)
    opts = " ".join(f"({letter}) {c}" for letter, c in zip("ABCD", choices, strict=True))
    return f"Question: {q}\n{opts}\nAnswer:"


def _mc_mmlu(rng: random.Random, subject: str, q: str, right: str, *wrong: str) -> str:
    choices = [right, *wrong]
    rng.shuffle(choices)
    lines = [q] + [f"{letter}. {c}" for letter, c in zip("ABCD", choices, strict=True)]
    header = (
        "The following are multiple choice questions (with answers) about "
        f"{subject.replace('_', ' ')}.\n\n"
    )
    return header + "\n".join(lines) + "\nAnswer:"


def build() -> list[dict[str, str]]:
    """All 300 rows, grouped by style in the order of ``STYLE_LABELS``."""
    rng = random.Random(SEED)
    styles: dict[str, list[str]] = {
        "science": [_mc_science(rng, *item) for item in SCIENCE],
        "math": [f"Question: {t(rng)}\nAnswer:" for _ in range(2) for t in _math_templates()],
        "commonsense": [f"{label}: {ctx}" for label, ctx in COMMONSENSE],
        "multi_subject": [_mc_mmlu(rng, *item) for item in MMLU],
        "truthfulness": [f"Q: {q}\nA:" for q in TRUTHFULNESS],
        "pronoun": _pronoun_prompts(rng),
    }
    rows: list[dict[str, str]] = []
    for label, texts in styles.items():
        assert len(texts) == 50, (label, len(texts))
        assert len(set(texts)) == 50, label
        rows += [
            {"prompt_id": f"{label}-{i:02d}", "text": t, "label": label}
            for i, t in enumerate(texts)
        ]
    return rows


def main() -> None:
    rows = build()
    with OUT.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} prompts to {OUT}")


if __name__ == "__main__":
    main()
