"""Writes bench/data/knowledge_updates.json: synthetic users whose facts change over sessions.

Why a generator: 200+ cases written one by one would repeat themselves anyway; here every
sentence is hand-written (the templates below), and a seeded draw combines them, so the set
is reproducible (``python bench/data/make_knowledge_updates.py`` rewrites the same file) and
its phrasing is deliberately varied: about half of the statements use the verbs the offline
extractor knows (``live in``, ``work at``, ``call me``), the rest say the same thing the way
people do in chat ("home is Porto now", "the Brightwave badge finally arrived", "we signed the
lease on a flat in ...") so a rule that matches only the extractor's verbs misses them.

Each case: the old value stated in an early session, sometimes a second old value in a middle
session, the new value in the last session; distractors of the same type about other people
("my sister lives in Oslo") and filler chat around them. Nothing here comes from LoCoMo.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("knowledge_updates.json")
SEED = 16
USERS = 62
CASES_PER_USER = 4

NAMES = ["Priya", "Tomasz", "Aiko", "Marcus", "Lena", "Diego", "Fatima", "Oliver", "Ingrid", "Kwame", "Sofia",
         "Hamid", "Chloe", "Ravi", "Nadia", "Jonas", "Elena", "Tariq", "Mei", "Lucas", "Anya", "Bruno", "Zara",
         "Felix", "Leila", "Mateo", "Hana", "Oscar", "Yara", "Emil", "Carmen", "Dev", "Greta", "Idris", "Noor",
         "Pablo", "Rosa", "Sven", "Tara", "Viktor", "Wanda", "Yusuf", "Amara", "Björn", "Celine", "Dmitri",
         "Esther", "Farah", "Gideon", "Helga", "Imani", "Jasper", "Keiko", "Lars", "Mira", "Nikos", "Olga",
         "Pierre", "Quinn", "Rania", "Soren", "Thea"]
CITIES = ["Lisbon", "Porto", "Rotterdam", "Leeds", "Denver", "Montreal", "Valencia", "Krakow", "Gothenburg",
          "Adelaide", "Wellington", "Nairobi", "Osaka", "Tucson", "Edinburgh", "Bologna", "Ghent", "Halifax",
          "Tallinn", "Cork", "Lyon", "Bilbao", "Austin", "Pittsburgh", "Graz", "Bergen", "Seville", "Brno",
          "Malmo", "Dunedin", "Hobart", "Quito", "Kyoto", "Leipzig", "Ljubljana", "Bristol"]
ORGS = ["Northwind Logistics", "Brightwave Labs", "Halcyon Health", "Quarry Bank", "Tessellate Studio",
        "Ferngrove Foods", "Ironbark Energy", "Lumen Analytics", "Copperleaf Insurance", "Bluefin Robotics",
        "Saltmarsh Press", "Redkite Games", "Orchard Street Clinic", "Vantage Freight", "Marlowe & Finch",
        "Greyhound Software", "Pinecrest Academy", "Alder Capital", "Silverline Telecom", "Kestrel Aerospace",
        "Moonbeam Media", "Driftwood Hotels", "Nimbus Cloud", "Harbourview Hospital", "Stonegate Architects",
        "Wildflower Bakery", "Clearwater Utilities", "Foxglove Pharma", "Granite Legal", "Juniper Retail"]
PARTNERS = ["Maya", "Jonah", "Elif", "Rafael", "Sasha", "Theo", "Ingrid", "Kofi", "Lucia", "Malik", "Nina",
            "Owen", "Paula", "Reza", "Selin", "Tobias", "Uma", "Valentin", "Wren", "Xavier", "Yasmin", "Zoltan",
            "Annika", "Benedikt", "Clara", "Dario"]
NICKS = [("Alexandra", "Sasha"), ("Jonathan", "Jon"), ("Margaret", "Maggie"), ("Benjamin", "Benji"),
         ("Katarina", "Kat"), ("Frederick", "Fred"), ("Elizabeth", "Liz"), ("Nicholas", "Nico"),
         ("Gabriella", "Gabi"), ("Theodore", "Teddy"), ("Rebecca", "Becca"), ("Dominic", "Dom")]
BUSINESSES = ["Crumb and Co", "Golden Crust", "Paper Lantern", "Second Spin", "Tidepool Tees", "Copper Kettle",
              "Fable Prints", "Loop Cycles", "Hearth Candles", "Nettle Studio", "Blue Door Books", "Sprout Box"]
CUISINES = ["Thai", "Ethiopian", "Korean", "Peruvian", "Lebanese", "Georgian", "Sichuan", "Mexican",
            "Vietnamese", "Turkish", "Basque", "Malaysian"]
DRINKS = ["flat white", "oat latte", "cortado", "green tea", "chai", "americano", "matcha", "hot chocolate"]
DIETS = ["vegetarian", "vegan", "pescatarian", "keto", "gluten-free"]
SPORTS = ["bouldering", "rowing", "squash", "salsa dancing", "trail running", "fencing", "pottery",
          "archery", "kayaking", "chess", "birdwatching", "volleyball"]
CARS = ["Volvo estate", "Nissan Leaf", "Mini Cooper", "Toyota Hilux", "Skoda Octavia", "Tesla Model 3",
        "Fiat Panda", "Subaru Outback", "Kia Niro"]
PETS = ["Biscuit", "Pepper", "Mochi", "Waffles", "Juniper", "Ziggy", "Noodle", "Clementine", "Pickles", "Otis"]
SCHOOLS = ["Trinity College", "Delft University", "the Sorbonne", "McGill", "ETH Zurich", "Monash",
           "the Open University", "Bocconi"]
MANAGERS = ["Gerald", "Priscilla", "Harvey", "Ottilie", "Desmond", "Philippa", "Cornelius", "Rosalind"]

# kind -> (pool, predicate, [old-statement templates], [new-statement templates], [distractor templates],
#          [question templates]). {v} the value, {o} the previous value, {n} the user's name.
KINDS: dict[str, dict] = {
    "move": {"pool": CITIES, "predicate": "lives_in", "category": "moves",
        "old": ["I live in {v}, so anything near the river there works for me.",
                "Just so you know, home for me is {v}.",
                "We've been renting a little flat in {v} for three years now.",
                "I'm based in {v} at the moment, mostly working from the kitchen table.",
                "The weather in {v} has been miserable all week, typical for where I live.",
                "My street in {v} is getting a new tram line, the noise is unreal."],
        "new": ["Big news: we moved to {v} last weekend, boxes everywhere.",
                "I live in {v} now, the move from {o} finally happened.",
                "Home is {v} these days, I handed the keys back in {o} on Friday.",
                "We signed the lease on a place in {v}, and I already love the neighbourhood.",
                "Now that I'm settled in {v}, can you find me a good dentist nearby?",
                "Update: I relocated to {v} for good, {o} is behind me."],
        "distractor": ["My sister lives in {v}, we might visit her at Easter.",
                       "A friend just got back from a conference in {v}.",
                       "Have you ever heard good things about {v}? My cousin keeps raving about it."],
        "question": ["Where does {n} live now?", "Which city is {n} based in?", "What city does {n} call home?",
                     "Where is {n}'s home at the moment?"]},
    "job": {"pool": ORGS, "predicate": "works_at", "category": "jobs",
        "old": ["I work at {v}, mostly on the scheduling side.",
                "Long week at {v} again, the quarterly review ate everything.",
                "My employer, {v}, gives us Fridays off in summer.",
                "I've been with {v} for about four years.",
                "Our team at {v} is moving to a new office floor."],
        "new": ["I started a new job at {v} on Monday!",
                "I handed in my notice at {o}; from next month I'm at {v}.",
                "The badge from {v} finally arrived, so it's official: I work there now.",
                "First week at {v} done, way better than {o}.",
                "I'm now on the payroll at {v}, no more commuting to {o}."],
        "distractor": ["My brother just got an interview at {v}.",
                       "I saw an ad for {v} on the train this morning.",
                       "A neighbour of mine used to consult for {v}."],
        "question": ["Where does {n} work now?", "Who is {n}'s current employer?", "Which company does {n} work for?",
                     "What organisation employs {n} these days?"]},
    "partner": {"pool": PARTNERS, "predicate": "partner_of", "category": "relationships",
        "old": ["My other half, {v}, and I are planning a weekend away.",
                "I'm seeing someone called {v}, it's been a few months.",
                "{v}, my partner, thinks I should learn to cook properly.",
                "{v} and I have been together since university."],
        "new": ["{o} and I broke up in the spring. I've been dating {v} since June.",
                "My partner now is {v}; things with {o} ended a while ago.",
                "I got engaged to {v} last night!",
                "After the breakup with {o}, I met {v} at a climbing gym and we're together now.",
                "{v} moved in with me last month, we're very happy."],
        "distractor": ["My colleague {v} is getting married in August.",
                       "I had lunch with my old classmate {v} yesterday.",
                       "Our neighbour {v} lent us a ladder."],
        "question": ["Who is {n}'s partner now?", "Who is {n} in a relationship with?", "Who is {n} dating?",
                     "What is the name of {n}'s current partner?"]},
    "nickname": {"pool": NICKS, "predicate": "is_named", "category": "names",
        "old": ["Please call me {v}, I like the full name.",
                "Everyone at work calls me {v}, so that's fine.",
                "I prefer {v} when you address me."],
        "new": ["Actually, I go by {v} these days, {o} feels too formal.",
                "Small thing: could you use {v} from now on instead of {o}?",
                "Call me {v} please, nobody uses {o} any more."],
        "distractor": ["My cousin is also called {v}, which gets confusing."],
        "question": ["What name does {n} want to be called?", "How should I address {n}?",
                     "What name does {n} go by now?"]},
    "business": {"pool": BUSINESSES, "predicate": "is_named", "category": "names",
        "old": ["My little online shop is called {v}.",
                "Orders at {v}, my side business, have doubled since March.",
                "I run a stall at the market under the name {v}."],
        "new": ["We rebranded the shop: it's {v} now, {o} was too hard to search for.",
                "The business has a new name, {v}; the old {o} signs are coming down.",
                "From today my shop trades as {v}."],
        "distractor": ["There's a shop called {v} across the road, no relation."],
        "question": ["What is {n}'s shop called now?", "What's the current name of {n}'s business?",
                     "Under which name does {n}'s shop trade?"]},
    "cuisine": {"pool": CUISINES, "predicate": "prefers", "category": "preferences",
        "old": ["{v} food is my absolute favourite, I could eat it every day.",
                "If you suggest restaurants, {v} is always my first pick.",
                "Nothing beats a good {v} dinner for me."],
        "new": ["Honestly I'm over {o} food; {v} is my favourite now.",
                "These days my go-to cuisine is {v}.",
                "I've gone completely off {o}. Recommend {v} places instead, that's what I crave now."],
        "distractor": ["My dad only ever eats {v}.", "We walked past a {v} place that had a huge queue."],
        "question": ["What is {n}'s favourite cuisine now?", "What kind of food does {n} prefer these days?",
                     "Which cuisine should I suggest to {n}?"]},
    "drink": {"pool": DRINKS, "predicate": "prefers", "category": "preferences",
        "old": ["My usual coffee order is a {v}.", "I always get a {v} in the morning.",
                "A {v} before work is non-negotiable."],
        "new": ["I switched from {o} to {v}, my stomach is much happier.",
                "New morning routine: a {v}, no more {o}.",
                "I've been ordering a {v} every day lately."],
        "distractor": ["My flatmate drinks {v} all day long."],
        "question": ["What does {n} drink in the morning now?", "What is {n}'s usual order at the cafe?",
                     "What's {n}'s current morning drink?"]},
    "diet": {"pool": DIETS, "predicate": "diet", "category": "preferences",
        "old": ["I'm {v}, just so you know when you pick restaurants.",
                "I've been {v} for a couple of years.", "Please keep in mind I eat {v}."],
        "new": ["I've gone {v} since January, so {o} menus aren't enough any more.",
                "Diet update: I'm {v} now.", "I stopped being {o}; I follow a {v} diet these days."],
        "distractor": ["My partner's mother is {v}, we cook separately for her."],
        "question": ["What diet does {n} follow now?", "What are {n}'s current dietary requirements?",
                     "What should I know about {n}'s diet?"]},
    "hobby": {"pool": SPORTS, "predicate": "hobby", "category": "preferences",
        "old": ["My main hobby is {v}, three evenings a week.", "I spend most weekends {v}.",
                "I'm really into {v} at the moment."],
        "new": ["I gave up {o}, my knees hated it. {v} is my thing now.",
                "New hobby: {v}! I go twice a week.", "These days it's all {v} for me, I barely think about {o}."],
        "distractor": ["My niece just won a medal in {v}."],
        "question": ["What is {n}'s main hobby now?", "What does {n} do in their free time these days?",
                     "Which activity is {n} into currently?"]},
    "car": {"pool": CARS, "predicate": "owns", "category": "possessions",
        "old": ["I drive a {v}, so parking is never an issue.", "The {v} needs a service soon."],
        "new": ["Sold the {o}! I'm driving a {v} now.", "We traded in the {o} for a {v} last week.",
                "My car is a {v} these days."],
        "distractor": ["My boss just bought a {v}."],
        "question": ["What car does {n} drive now?", "Which car does {n} have at the moment?"]},
    "school": {"pool": SCHOOLS, "predicate": "studies_at", "category": "education",
        "old": ["I'm doing a part-time master's at {v}.", "Lectures at {v} start at eight, it's brutal."],
        "new": ["I transferred from {o} to {v} this term.", "I'm a student at {v} now, the {o} course wasn't for me."],
        "distractor": ["My friend teaches at {v}."],
        "question": ["Where does {n} study now?", "Which university is {n} enrolled at?"]},
    "manager": {"pool": MANAGERS, "predicate": "reports_to", "category": "jobs",
        "old": ["My manager {v} wants the report by Thursday.", "I report to {v}, who is very detail-oriented."],
        "new": ["{o} left the company, so my new boss is {v}.", "I report to {v} now after the reorg."],
        "distractor": ["{v} from accounting brought cake today."],
        "question": ["Who is {n}'s manager now?", "Who does {n} report to?"]},
}
PET_OLD = "By the way, my dog {v} says hello."  # a constant name: a fact that does not change

FILLER_USER = ["Can you help me plan meals for the week?", "What's a good podcast for a long drive?",
               "Remind me to call the plumber tomorrow.", "Any tips for sleeping better?",
               "I need a birthday present idea for a colleague.", "How long should I boil an egg for a soft yolk?",
               "Could you draft a polite email declining a meeting?", "What's the best way to learn Spanish verbs?",
               "I'm thinking of repainting the living room, any colour ideas?", "Help me pack for a rainy weekend."]
FILLER_ASSISTANT = ["Sure, here are a few ideas to get you started.", "Happy to help with that.",
                    "Here's a short plan you can adjust.", "Good question, here's what usually works.",
                    "Done, let me know if you want changes.", "That sounds great, tell me more."]
ACK_OLD = ["Got it, I'll remember that.", "Thanks, noted.", "Good to know!", "Understood."]
ACK_NEW = ["Congratulations, that's a big change!", "Thanks for the update, noted.", "Got it, I'll use that from now on.",
           "Oh nice, I'll keep that in mind."]


def value_text(kind: str, value: object, new: bool) -> str:
    if kind == "nickname":
        assert isinstance(value, tuple)
        return value[1] if new else value[0]
    return str(value)


def make() -> dict:
    rng = random.Random(SEED)
    kinds = list(KINDS)
    weights = {"move": 4, "job": 4, "partner": 3, "nickname": 1, "business": 1, "cuisine": 2, "drink": 1,
               "diet": 1, "hobby": 2, "car": 1, "school": 1, "manager": 1}
    users, cases = [], []
    for u in range(USERS):
        name = NAMES[u % len(NAMES)]
        user_id = f"ku-{u:03d}-{name.lower()}"
        chosen: list[str] = []
        while len(chosen) < CASES_PER_USER:
            k = rng.choices(kinds, [weights[x] for x in kinds])[0]
            if k not in chosen:
                chosen.append(k)
        sessions: list[list[dict]] = [[], [], []]
        sessions[0].append({"role": "user", "content": f"Hi! I'm {name}. {PET_OLD.format(v=rng.choice(PETS))}"})
        sessions[0].append({"role": "assistant", "content": f"Nice to meet you, {name}!"})
        for kind in chosen:
            spec = KINDS[kind]
            pool = spec["pool"]
            chain = 3 if rng.random() < 0.25 else 2
            picks = rng.sample(pool, chain + 1)
            if kind == "nickname":  # the old and new names are one person's pair: the full name, then the short one
                pair = picks[0]
                values = [pair[0], pair[1]]
                distractor = picks[1][0]
                chain = 2
            else:
                values = [str(p) for p in picks[:chain]]
                distractor = str(picks[chain])
            old_values, new_value = values[:-1], values[-1]
            # where each value is said: the first old value in session 1, a second one in session 2, the new in 3
            for i, old in enumerate(old_values):
                s = 0 if i == 0 else 1
                prev = old_values[i - 1] if i else ""
                tmpl = rng.choice(spec["old"] if i == 0 else spec["new"])
                sessions[s].append({"role": "user", "content": tmpl.format(v=old, o=prev)})
                sessions[s].append({"role": "assistant", "content": rng.choice(ACK_OLD)})
            tmpl = rng.choice(spec["new"])
            sessions[2].append({"role": "user", "content": tmpl.format(v=new_value, o=old_values[-1])})
            sessions[2].append({"role": "assistant", "content": rng.choice(ACK_NEW)})
            # a distractor of the same type, about someone or something else, in a random session
            d = rng.choice(spec["distractor"]).format(v=distractor)
            where = sessions[rng.randrange(3)]
            where.append({"role": "user", "content": d})
            where.append({"role": "assistant", "content": rng.choice(FILLER_ASSISTANT)})
            cases.append({"id": f"{user_id}-{kind}", "user_id": user_id, "user_name": name, "kind": kind,
                          "category": spec["category"], "predicate": spec["predicate"],
                          "question": rng.choice(spec["question"]).format(n=name),
                          "current": new_value, "superseded": old_values, "distractors": [distractor]})
        for s in sessions:  # filler chat between the statements, shuffled in pairs
            for _ in range(rng.randint(2, 4)):
                s.append({"role": "user", "content": rng.choice(FILLER_USER)})
                s.append({"role": "assistant", "content": rng.choice(FILLER_ASSISTANT)})
        ordered = []
        for number, s in enumerate(sessions, 1):
            head, body = s[:2] if number == 1 else [], s[2:] if number == 1 else s
            pairs = [body[i:i + 2] for i in range(0, len(body), 2)]
            rng.shuffle(pairs)
            msgs = head + [m for p in pairs for m in p]
            ordered.append({"number": number, "date": f"2026-0{2 * number + 1}-1{number}T18:00:00+00:00",
                            "messages": msgs})
        users.append({"user_id": user_id, "name": name, "sessions": ordered})
    return {"name": "knowledge_updates", "version": 1, "seed": SEED,
            "description": "Synthetic users whose facts change over three sessions (see README.md).",
            "users": users, "cases": cases}


def main() -> None:
    data = make()
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(data['users'])} users, {len(data['cases'])} cases, "
          f"{sum(len(s['messages']) for u in data['users'] for s in u['sessions'])} messages")


if __name__ == "__main__":
    main()
