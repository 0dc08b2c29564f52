"""The expert catalog of a CoE model bundle: 150 named experts (15 domains x 10
specialties, Samba-CoE v0.2's size), each with the keyword description the router builds
its centroid from; replicas beyond 150 repeat the names with a numeric suffix."""

from __future__ import annotations

from rdurack.errors import InvalidRequest, UnknownName

# Domain -> (keywords every expert of the domain shares, {specialty: its keywords}).
# 15 domains x 10 specialties = 150 experts, Samba-CoE v0.2's size. Keywords are what
# a prompt for that expert would say; the router's centroids are built from them.
_CATALOG: dict[str, tuple[str, dict[str, str]]] = {
    "coding": (
        "code program programming function bug fix debug error exception compile "
        "compiler script class method variable refactor implement library crash "
        "throws stack trace syntax",
        {
            "python": "python pip django flask numpy pandas keyerror indentation def "
            "pytest asyncio dict traceback",
            "javascript": "javascript js node npm react promise async await dom undefined browser",
            "rust": "rust cargo borrow checker lifetime ownership trait crate unsafe",
            "cpp": "c++ cpp template pointer segfault stl header cmake undefined behavior",
            "java": "java jvm spring maven gradle nullpointerexception interface",
            "go": "golang go goroutine channel gofmt defer panic",
            "sql": "sql query select join table index postgres mysql database",
            "shell": "bash shell terminal grep sed awk pipe command line",
            "haskell": "haskell monad functor lazy typeclass ghc",
            "typescript": "typescript tsc type annotation generics interface tsconfig",
        },
    ),
    "math": (
        "math mathematics solve equation prove proof theorem formula compute number "
        "calculate derive",
        {
            "algebra": "algebra polynomial quadratic roots factor variable expression",
            "calculus": "calculus derivative integral limit differentiate integrate series",
            "geometry": "geometry triangle circle angle area polygon euclid",
            "statistics": "statistics mean variance regression hypothesis test sample distribution",
            "probability": "probability chance random dice coin odds bayes expected",
            "number-theory": "prime primes divisible modular congruence gcd integer",
            "linear-algebra": "matrix matrices vector eigenvalue determinant linear transformation",
            "topology": "topology manifold continuous open set homeomorphism compact",
            "combinatorics": "combinatorics permutations combinations counting graph "
            "choose binomial",
            "logic": "logic boolean propositional predicate truth table induction",
        },
    ),
    "law": (
        "law legal lawyer attorney court clause liability lawsuit statute judge rights agreement",
        {
            "contracts": "contract contracts breach clause signed terms party agreement",
            "criminal": "criminal crime arrest charge defense prosecution sentence",
            "patents": "patent patents invention infringement prior art claims",
            "tax": "tax taxes irs deduction filing audit income",
            "employment": "employment employer employee fired wrongful termination wage",
            "immigration": "immigration visa green card citizenship asylum deportation",
            "family": "divorce custody child support marriage alimony",
            "corporate": "corporate merger acquisition shareholder board incorporation",
            "privacy": "privacy gdpr personal data consent breach notification",
            "real-estate": "lease landlord tenant property eviction deed zoning",
        },
    ),
    "medicine": (
        "medical medicine doctor patient symptoms diagnosis treatment disease clinical health pain",
        {
            "cardiology": "heart cardiac cardiology blood pressure chest arrhythmia cholesterol",
            "oncology": "cancer tumor tumour chemotherapy oncology metastasis biopsy",
            "neurology": "brain nerve neurology stroke seizure migraine headache",
            "pediatrics": "child children infant baby pediatric vaccine fever",
            "dermatology": "skin rash acne eczema dermatology mole",
            "radiology": "xray mri ct scan imaging radiology ultrasound",
            "psychiatry": "depression anxiety psychiatric mental therapy bipolar",
            "endocrinology": "diabetes insulin thyroid hormone glucose endocrine",
            "orthopedics": "bone fracture joint knee spine orthopedic sprain",
            "pharmacology": "drug dose dosage medication side effects interaction pharmacy",
        },
    ),
    "translation": (
        "translate translation translating translator sentence phrase language into meaning word",
        {
            "french": "french français france bonjour",
            "german": "german deutsch germany guten",
            "spanish": "spanish español spain hola mexico",
            "italian": "italian italiano italy ciao",
            "portuguese": "portuguese português brazil portugal obrigado",
            "japanese": "japanese japan 日本語 kanji hiragana",
            "chinese": "chinese mandarin 中文 china cantonese",
            "korean": "korean korea 한국어 hangul",
            "arabic": "arabic العربية arab",
            "russian": "russian русский russia cyrillic",
        },
    ),
    "finance": (
        "finance financial money invest investment market price return risk portfolio",
        {
            "banking": "bank banking account loan interest deposit credit",
            "investing": "stocks bonds etf index fund dividend shares",
            "accounting": "accounting ledger balance sheet depreciation bookkeeping gaap",
            "insurance": "insurance premium policy claim coverage deductible",
            "crypto": "crypto bitcoin ethereum blockchain token wallet",
            "mortgages": "mortgage home loan refinance down payment rate",
            "retirement": "retirement pension 401k ira savings retire",
            "trading": "trading options futures forex day trader short",
            "budgeting": "budget budgeting expenses spending save debt",
            "auditing": "audit auditor controls compliance fraud sox",
        },
    ),
    "science": (
        "science scientific experiment theory research hypothesis explain why",
        {
            "physics": "physics force energy quantum gravity momentum relativity",
            "chemistry": "chemistry molecule reaction acid bond element compound",
            "biology": "biology cell organism evolution protein species",
            "astronomy": "astronomy star planet galaxy telescope orbit black hole",
            "geology": "geology rock earthquake volcano mineral plate tectonics",
            "ecology": "ecology ecosystem habitat biodiversity species population",
            "genetics": "genetics dna gene mutation genome heredity",
            "climate": "climate warming carbon emissions weather greenhouse",
            "materials": "materials alloy polymer crystal semiconductor strength",
            "neuroscience": "neuroscience neuron synapse cortex neural",
        },
    ),
    "writing": (
        "write writing draft text story style tone edit paragraph words",
        {
            "poetry": "poem poetry rhyme verse sonnet haiku stanza",
            "fiction": "novel fiction character plot chapter narrative",
            "screenwriting": "screenplay script scene dialogue film movie",
            "journalism": "news article journalist headline report interview",
            "copywriting": "ad copy slogan tagline advert landing page",
            "technical": "documentation manual readme api docs tutorial",
            "academic": "essay thesis paper citation abstract dissertation",
            "editing": "proofread grammar spelling rewrite clarity typo",
            "speeches": "speech toast wedding keynote address audience",
            "letters": "letter cover email formal recommendation resignation",
        },
    ),
    "business": (
        "business company customers team strategy plan growth revenue",
        {
            "marketing": "marketing brand campaign social media seo audience",
            "sales": "sales pipeline leads prospect deal quota crm",
            "strategy": "strategic competitive advantage competitors swot",
            "hr": "hr hiring recruiting onboarding interview candidates",
            "operations": "operations process efficiency workflow logistics",
            "supply-chain": "supply chain inventory supplier procurement warehouse",
            "startups": "startup founder venture capital pitch fundraising",
            "negotiation": "negotiate negotiation offer counteroffer terms",
            "management": "manager management leadership employees meeting",
            "ecommerce": "ecommerce online store shop checkout cart shopify",
        },
    ),
    "history": (
        "history historical century war empire king era ancient past",
        {
            "ancient": "rome roman greece greek egypt pharaoh",
            "medieval": "medieval middle ages feudal crusades castle knight",
            "renaissance": "renaissance florence medici humanism",
            "modern": "twentieth cold war industrial revolution",
            "military": "battle army general siege invasion",
            "art": "painting painter sculpture artist museum",
            "economic": "economy trade depression recession industrial",
            "american": "america american civil war independence president",
            "asian": "dynasty ming qing samurai shogun",
            "european": "europe napoleon monarchy revolution treaty",
        },
    ),
    "engineering": (
        "engineering engineer design system build load specification",
        {
            "mechanical": "mechanical gear engine torque thermodynamics",
            "electrical": "electrical circuit voltage current resistor power",
            "civil": "civil bridge concrete structure beam foundation",
            "chemical": "chemical reactor plant distillation process",
            "aerospace": "aerospace aircraft rocket wing propulsion",
            "automotive": "car vehicle automotive transmission brakes",
            "robotics": "robot robotics actuator sensor motion control",
            "signals": "signal filter fourier frequency sampling",
            "semiconductors": "chip transistor wafer lithography fab",
            "energy": "solar wind turbine grid battery",
        },
    ),
    "cooking": (
        "cook cooking recipe food kitchen ingredients dish meal",
        {
            "baking": "bake baking bread cake oven flour dough",
            "grilling": "grill grilling bbq barbecue steak smoke",
            "vegetarian": "vegetarian vegan tofu plant based vegetables",
            "desserts": "dessert sweet chocolate ice cream pudding",
            "pastry": "pastry croissant pie tart butter",
            "fermentation": "ferment fermentation kimchi sourdough pickle",
            "nutrition": "nutrition calories protein diet healthy",
            "meal-prep": "meal prep weekly batch lunch leftovers",
            "seafood": "fish seafood shrimp salmon sushi",
            "spices": "spice spices curry chili seasoning herbs",
        },
    ),
    "sports": (
        "sport sports game player team match training coach score",
        {
            "football": "football soccer goal striker penalty",
            "basketball": "basketball nba dunk hoop rebound",
            "tennis": "tennis serve racket wimbledon",
            "running": "running marathon run pace jog",
            "cycling": "cycling bike bicycle ride tour",
            "swimming": "swimming swim pool stroke freestyle",
            "chess": "chess opening checkmate gambit pawn",
            "golf": "golf swing putt course club",
            "baseball": "baseball pitcher inning batting",
            "fitness": "fitness gym workout exercise strength muscle",
        },
    ),
    "music": (
        "music musical song songs sound play musician",
        {
            "theory": "theory chord scale harmony key interval",
            "guitar": "guitar strings fret riff",
            "piano": "piano keys pianist sonata",
            "composition": "compose composition melody arrangement",
            "production": "production mixing mastering daw beat",
            "jazz": "jazz improvisation swing bebop",
            "classical": "classical symphony orchestra mozart bach",
            "singing": "sing singing vocal voice choir",
            "drums": "drums drum rhythm percussion groove",
            "lyrics": "lyrics rhyme chorus verse songwriting",
        },
    ),
    "devops": (
        "devops deploy deployment server infrastructure production cluster",
        {
            "kubernetes": "kubernetes k8s pod helm kubectl",
            "docker": "docker container dockerfile image compose",
            "networking": "network dns tcp firewall latency ip",
            "security": "security vulnerability tls certificate attack",
            "databases": "database backup replication postgres",
            "linux": "linux kernel systemd ubuntu permissions",
            "cloud": "cloud aws azure gcp instance",
            "monitoring": "monitoring metrics alerts logs prometheus grafana",
            "ci-cd": "ci cd pipeline github actions jenkins build",
            "storage": "storage disk volume filesystem raid",
        },
    ),
}

_DOMAINS = list(_CATALOG)
_SPECIALTIES = max(len(specs) for _, specs in _CATALOG.values())
if any(len(specs) != _SPECIALTIES for _, specs in _CATALOG.values()):
    raise AssertionError("every domain needs the same number of specialties")

# Interleaved by domain (coding-python, math-algebra, law-contracts, ...): the first n
# names of a small bundle cover as many domains as possible.
_BASE: list[tuple[str, str]] = [
    (f"{domain}-{specialty}", f"{_CATALOG[domain][0]} {words}")
    for i in range(_SPECIALTIES)
    for domain in _DOMAINS
    for specialty, words in [list(_CATALOG[domain][1].items())[i]]
]
_DESCRIPTIONS = dict(_BASE)
CATALOG_SIZE = len(_BASE)  # 150 distinct base names


def expert_names(n: int) -> list[str]:
    """`n` distinct, stable expert names. Beyond the 150 base names, replicas follow
    with a numeric suffix ("coding-python-2"); a replica has its base's description."""
    if n < 0:
        raise InvalidRequest(f"the number of experts must be >= 0, got {n}")
    return [
        _BASE[i % CATALOG_SIZE][0] + (f"-{i // CATALOG_SIZE + 1}" if i >= CATALOG_SIZE else "")
        for i in range(n)
    ]


def expert_description(name: str) -> str:
    """The keyword description of a catalog expert (replica suffixes allowed)."""
    if name in _DESCRIPTIONS:
        return _DESCRIPTIONS[name]
    base, _, suffix = name.rpartition("-")
    if suffix.isdigit() and int(suffix) >= 2 and base in _DESCRIPTIONS:
        return _DESCRIPTIONS[base]
    raise UnknownName("expert", name, [n for n, _ in _BASE])
