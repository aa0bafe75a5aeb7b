"""The general synthetic text mix the fixture base model is pretrained on.

The base must be a plausible small language model of the shopping domain (product copy, reviews, chit-chat,
generic JSON, English and Traditional Chinese) without being the commerce task model: no document here uses the
task's system prompt or its JSON keys. The JSON extraction chats use other record shapes (events, contacts,
orders, ...) so that the base learns to copy spans into JSON, which the LoRA stage then specialises.

Every document is a string ready for the tokenizer: plain documents are wrapped as ``<|bos|>text<|eot|>``, chats
are rendered with the chat template convention. Generation is deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
from typing import Callable

from specops.task import lexicon as lx

BOS, EOT = "<|bos|>", "<|eot|>"

BRANDS = [
    "Apple", "Samsung", "Sony", "LG", "Asus", "Acer", "Lenovo", "Dell", "HP", "Xiaomi", "Google", "Nokia", "Oppo",
    "Canon", "Nikon", "Fujifilm", "GoPro", "Bose", "JBL", "Sennheiser", "Logitech", "Razer", "Nintendo", "Microsoft",
    "Philips", "Panasonic", "Dyson", "Tatung", "Zojirushi", "Tefal", "IKEA", "Muji", "Nike", "Adidas", "Puma",
    "New Balance", "Uniqlo", "Zara", "Levi's", "Coach", "Samsonite", "L'Oreal", "Shiseido", "Lancome", "Decathlon",
    "Coleman", "Lego", "Hasbro", "Garmin", "Fitbit", "Royal Canin", "Pampers", "Toyota", "Bosch", "Kirin", "Giant",
]

PRODUCTS_EN = {
    "phones": ["phone", "smartphone", "phone case", "charger", "screen protector"],
    "computers": ["laptop", "monitor", "keyboard", "mouse", "tablet", "SSD"],
    "audio": ["earbuds", "headphones", "speaker", "soundbar", "microphone"],
    "cameras": ["camera", "lens", "tripod", "action camera"],
    "home": ["vacuum", "air purifier", "lamp", "fan", "towel set"],
    "kitchen": ["rice cooker", "kettle", "frying pan", "blender", "coffee maker"],
    "clothing": ["jacket", "t-shirt", "hoodie", "jeans", "dress", "sweater"],
    "shoes": ["running shoes", "sneakers", "boots", "sandals"],
    "bags": ["backpack", "suitcase", "tote bag", "wallet"],
    "beauty": ["lipstick", "sunscreen", "moisturizer", "shampoo"],
    "sports": ["yoga mat", "dumbbells", "bicycle", "tennis racket"],
    "outdoors": ["tent", "sleeping bag", "camping stove", "hiking poles"],
    "toys": ["building blocks", "board game", "puzzle", "toy car"],
    "pets": ["dog food", "cat litter", "pet bed", "leash"],
}
PRODUCTS_ZH = {
    "phones": ["手機", "手機殼", "充電器", "保護貼"],
    "computers": ["筆電", "螢幕", "鍵盤", "滑鼠", "平板"],
    "audio": ["耳機", "藍牙喇叭", "麥克風"],
    "cameras": ["相機", "鏡頭", "腳架"],
    "home": ["吸塵器", "空氣清淨機", "檯燈", "電風扇", "毛巾"],
    "kitchen": ["電子鍋", "快煮壺", "平底鍋", "果汁機", "咖啡機"],
    "clothing": ["外套", "T恤", "帽T", "牛仔褲", "洋裝", "毛衣"],
    "shoes": ["慢跑鞋", "球鞋", "靴子", "涼鞋"],
    "bags": ["後背包", "行李箱", "托特包", "錢包"],
    "beauty": ["口紅", "防曬乳", "乳液", "洗髮精"],
    "sports": ["瑜珈墊", "啞鈴", "腳踏車", "網球拍"],
    "outdoors": ["帳篷", "睡袋", "登山杖"],
    "toys": ["積木", "桌遊", "拼圖", "玩具車"],
    "pets": ["狗飼料", "貓砂", "寵物床", "牽繩"],
}
COLORS_EN = ["black", "white", "gray", "silver", "gold", "red", "pink", "orange", "yellow", "green", "blue", "navy",
             "purple", "brown", "beige"]
COLORS_ZH = ["黑色", "白色", "灰色", "銀色", "金色", "紅色", "粉紅色", "橘色", "黃色", "綠色", "藍色", "深藍色",
             "紫色", "咖啡色", "米色"]
FEATURES_EN = [
    "It is light enough to carry all day", "The battery lasts about {n} hours", "It ships with a two-year warranty",
    "The build quality feels premium", "Setup takes less than {n} minutes", "It is easy to clean",
    "It works well for small apartments", "The fabric is soft and breathable", "It folds flat for storage",
    "It is water resistant", "The sound is clear even at high volume", "It charges fully in {n} minutes",
]
FEATURES_ZH = [
    "重量很輕，整天帶著也不累", "電池大約可以用{n}小時", "享有兩年保固", "做工很有質感", "{n}分鐘內就能完成設定",
    "清潔起來很方便", "很適合小坪數的房間", "布料柔軟又透氣", "可以摺疊收納", "具備防水功能", "音量開大也很清楚",
    "{n}分鐘就能充飽電",
]
OPINIONS_EN = [
    "Totally worth the money", "It broke after a week, very disappointed", "Good value but the packaging was damaged",
    "My kids love it", "Works as described", "The color is a bit darker than in the photos",
    "Customer service replied quickly", "I would buy it again", "Too small for me, I had to return it",
    "Shipping was fast and the seller was friendly",
]
OPINIONS_ZH = [
    "物超所值", "用一個禮拜就壞了，很失望", "CP值高但包裝有破損", "小孩很喜歡", "跟描述的一樣", "顏色比照片暗一點",
    "客服回覆很快", "會再回購", "尺寸太小，只好退貨", "出貨很快，賣家很親切",
]
CHAT_EN = [
    ("Hi! How are you today?", "I'm doing well, thanks for asking. How can I help you?"),
    ("What should I cook for dinner tonight?", "How about a simple stir-fry with vegetables and rice? It takes about twenty minutes."),
    ("Can you recommend a good book?", "If you like mysteries, try a classic detective novel. For something lighter, a travel memoir is fun."),
    ("Is it going to rain this weekend?", "I can't check the weather, but a weather app will have the latest forecast for your city."),
    ("I feel tired after work every day.", "That sounds hard. Regular sleep, a short walk and drinking enough water can help."),
    ("Tell me a fun fact.", "Octopuses have three hearts and blue blood."),
    ("How do I keep my plants alive?", "Most houseplants like bright indirect light and watering only when the soil is dry."),
    ("Thanks for your help!", "You're welcome! Have a great day."),
    ("What is a good gift for my mom?", "A warm scarf, a photo book or a nice tea set are thoughtful choices."),
    ("How many days are in a leap year?", "A leap year has 366 days."),
]
CHAT_ZH = [
    ("你好！今天過得如何？", "我很好，謝謝關心。有什麼可以幫你的嗎？"),
    ("今天晚餐要吃什麼好呢？", "可以試試簡單的蔬菜炒飯，大概二十分鐘就能完成。"),
    ("可以推薦一本好書嗎？", "如果你喜歡推理，可以看經典的偵探小說；想輕鬆一點的話，旅遊散文也不錯。"),
    ("這個週末會下雨嗎？", "我沒辦法查天氣，建議打開氣象App看看你所在城市的預報。"),
    ("每天下班都覺得好累。", "辛苦了。規律睡眠、散散步、多喝水都會有幫助。"),
    ("說一個有趣的冷知識。", "章魚有三顆心臟，血液是藍色的。"),
    ("植物要怎麼照顧才不會死？", "大多數室內植物喜歡明亮的散射光，土乾了再澆水就好。"),
    ("謝謝你的幫忙！", "不客氣！祝你有美好的一天。"),
    ("送媽媽什麼禮物好？", "溫暖的圍巾、相簿或一組好茶具都是貼心的選擇。"),
    ("閏年有幾天？", "閏年有366天。"),
]
NAMES = ["Alice Chen", "Bob Lin", "Carol Wang", "David Wu", "Emma Huang", "Frank Liu", "Grace Tsai", "Henry Chang",
         "陳小明", "林美玲", "王大同", "黃志豪", "張雅婷", "李建國"]
CITIES = ["Taipei", "Kaohsiung", "Tokyo", "London", "New York", "Berlin", "台北", "台中", "高雄", "新竹"]
SYSTEM_CHAT = ["You are a friendly assistant.", "You are a helpful assistant. Answer briefly.", "你是一個友善的助理。"]


def chat(messages: list[tuple[str, str]]) -> str:
    """One conversation in the chat template convention: ``<|bos|>`` then ``<|role|>\\ncontent<|eot|>\\n``."""
    return BOS + "".join(f"<|{role}|>\n{content}{EOT}\n" for role, content in messages)


def _price(rng: random.Random) -> int | float:
    value = rng.choice([rng.randint(1, 99) * 10, rng.randint(5, 500), rng.randint(1, 60) * 100 - 1])
    return value + 0.99 if rng.random() < 0.15 else value


def _catalog() -> tuple[dict, dict, dict]:
    """Products by language and category: the tables above plus the shop's catalog words.

    A commerce base model knows the shop's products, brands and categories (catalog copy is general domain
    text); what it has never seen is the search-parameter task itself.
    """
    products = {"en": {k: list(v) for k, v in PRODUCTS_EN.items()}, "zh-TW": {k: list(v) for k, v in PRODUCTS_ZH.items()}}
    brands: dict = {"en": {}, "zh-TW": {}}
    features: dict = {"en": {}, "zh-TW": {}}
    for name, cat in lx.CATEGORIES.items():
        for i, lang in enumerate(("en", "zh-TW")):
            items = products[lang].setdefault(name, [])
            items += [pair[i] for pair in cat.products if pair[i] not in items]
            brands[lang][name] = list(cat.brands[lang])
            features[lang][name] = [pair[i] for pair in cat.features]
    return products, brands, features


CATALOG, CATEGORY_BRANDS, CATEGORY_FEATURES = _catalog()


def _product(rng: random.Random, lang: str) -> tuple[str, str]:
    table = CATALOG[lang]
    category = rng.choice(sorted(table))
    return category, rng.choice(table[category])


def _brand(rng: random.Random, lang: str, category: str) -> str:
    own = CATEGORY_BRANDS[lang].get(category)
    return rng.choice(own) if own and rng.random() < 0.7 else rng.choice(BRANDS)


def _featured(rng: random.Random, lang: str, category: str, item: str) -> str:
    """Sometimes a catalog feature in front of the product: "waterproof bluetooth speaker", "防水藍牙喇叭"."""
    feats = CATEGORY_FEATURES[lang].get(category)
    if not feats or rng.random() < 0.6:
        return item
    return rng.choice(feats) + (" " if lang == "en" else "") + item


def description(rng: random.Random, lang: str) -> str:
    category, item = _product(rng, lang)
    brand, item = _brand(rng, lang, category), _featured(rng, lang, category, item)
    n, price = rng.randint(2, 40), _price(rng)
    if lang == "en":
        color = rng.choice(COLORS_EN)
        feats = " ".join(f.format(n=n) + "." for f in rng.sample(FEATURES_EN, 2))
        return f"The {brand} {item} comes in {color} and sells for ${price}. {feats}"
    color = rng.choice(COLORS_ZH)
    feats = "".join(f.format(n=n) + "。" for f in rng.sample(FEATURES_ZH, 2))
    return f"{brand}{item}有{color}可以選，售價{price}元。{feats}"


def review(rng: random.Random, lang: str) -> str:
    category, item = _product(rng, lang)
    brand = _brand(rng, lang, category)
    stars = rng.randint(1, 5)
    if lang == "en":
        return (f"{stars}/5 stars. I bought the {rng.choice(COLORS_EN)} {item} from {brand} last "
                f"{rng.choice(['week', 'month', 'year'])}. {rng.choice(OPINIONS_EN)}.")
    return f"{stars}顆星。{rng.choice(['上週', '上個月', '去年'])}買了{brand}的{rng.choice(COLORS_ZH)}{item}，{rng.choice(OPINIONS_ZH)}。"


def chitchat(rng: random.Random, lang: str) -> str:
    pairs = rng.sample(CHAT_EN if lang == "en" else CHAT_ZH, rng.randint(1, 3))
    turns = [("system", rng.choice(SYSTEM_CHAT))] if rng.random() < 0.6 else []
    for user, assistant in pairs:
        turns += [("user", user), ("assistant", assistant)]
    return chat(turns)


def product_record(rng: random.Random, lang: str) -> dict:
    """A catalog listing (not search parameters): the domain's vocabulary in another record shape."""
    category, item = _product(rng, lang)
    return {
        "sku": f"{rng.choice('ABCDEFGH')}{rng.randint(1000, 9999)}",
        "name": f"{_brand(rng, lang, category)} {_featured(rng, lang, category, item)}",
        "category": category,
        "price": _price(rng),
        "currency": rng.choice(["USD", "TWD", "EUR", "JPY"]),
        "colors": rng.sample(COLORS_EN, rng.randint(0, 3)),
        "sizes": rng.sample(["S", "M", "L", "XL", "38", "42", "10"], rng.randint(0, 2)),
        "rating": round(rng.uniform(1, 5), 1),
        "in_stock": rng.choice([True, False]),
        "free_shipping": rng.choice([True, False, None]),
        "condition": rng.choice(["new", "used", "refurbished"]),
        "discount": rng.choice([None, 10, 20, 0.15]),
    }


def search_page(rng: random.Random, lang: str) -> str:
    """Text of a results page: what shoppers see, in words, with the site's filter and sort vocabulary."""
    _, item = _product(rng, lang)
    n = rng.randint(2, 400)
    if lang == "en":
        sort = rng.choice(["relevance", "price: low to high", "price: high to low", "rating", "newest", "best selling"])
        filters = ", ".join(rng.sample(["free shipping", "in stock", "4 stars & up", "new", "used", "refurbished"], 2))
        return f"Showing {n} results for \"{item}\". Sort by: {sort}. Filters: {filters}. Category: {_product(rng, lang)[0]}."
    sort = rng.choice(["相關性", "價格由低到高", "價格由高到低", "評價", "最新上架", "熱銷"])
    filters = "、".join(rng.sample(["免運", "有現貨", "四星以上", "全新", "二手", "福利品"], 2))
    return f"「{item}」共有{n}筆結果。排序：{sort}。篩選：{filters}。"


def json_record(rng: random.Random, lang: str) -> str:
    records = [product_record(rng, lang) for _ in range(rng.randint(1, 3))]
    return json.dumps(records if len(records) > 1 else records[0], ensure_ascii=False)


def _extraction_event(rng: random.Random, lang: str) -> tuple[str, dict]:
    name, city = rng.choice(NAMES), rng.choice(CITIES)
    day, people = rng.randint(1, 28), rng.randint(2, 30)
    title = rng.choice(["team dinner", "birthday party", "book club", "yoga class"] if lang == "en"
                       else ["聚餐", "生日派對", "讀書會", "瑜珈課"])
    text = (f"{name} is hosting a {title} in {city} on May {day} for {people} people." if lang == "en"
            else f"{name}五月{day}日在{city}辦{title}，預計{people}人參加。")
    return text, {"title": title, "host": name, "city": city, "day": day, "guests": people, "online": False}


def _extraction_contact(rng: random.Random, lang: str) -> tuple[str, dict]:
    name = rng.choice(NAMES)
    phone = f"09{rng.randint(10, 99)}-{rng.randint(100, 999)}-{rng.randint(100, 999)}"
    email = rng.choice([None, f"user{rng.randint(1, 999)}@example.com"])
    text = (f"Contact {name} at {phone}" + (f" or {email}" if email else "") + "." if lang == "en"
            else f"請聯絡{name}，電話{phone}" + (f"，信箱{email}" if email else "") + "。")
    return text, {"name": name, "phone": phone, "email": email, "tags": []}


def _extraction_order(rng: random.Random, lang: str) -> tuple[str, dict]:
    category, item = _product(rng, lang)
    brand = _brand(rng, lang, category)
    qty, price = rng.randint(1, 5), _price(rng)
    gift = rng.random() < 0.3
    if lang == "en":
        text = f"I ordered {qty} {brand} {item} at {price} each" + (", please wrap it as a gift." if gift else ".")
    else:
        text = f"我訂了{qty}個{brand}{item}，每個{price}元" + ("，請幫我包裝成禮物。" if gift else "。")
    return text, {"item": item, "brand": brand, "quantity": qty, "unit_price": price, "gift_wrap": gift}


def _extraction_review(rng: random.Random, lang: str) -> tuple[str, dict]:
    text = review(rng, lang)
    stars = int(text.split("/")[0] if lang == "en" else text.split("顆")[0])
    return text, {"stars": stars, "positive": stars >= 4, "language": lang}


SYLLABLES = ["ka", "ri", "to", "mo", "zen", "lu", "vi", "xa", "no", "per", "sol", "dra", "qui", "bel", "ter", "on"]
ZH_CHARS = "雅風森光禾晴悅山海星木田川月青品良樂"


def coined(rng: random.Random, lang: str) -> str:
    """A made-up brand-like word: a value no prior can guess, so the only way to get it right is to copy it."""
    if lang == "en":
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
    return "".join(rng.choice(ZH_CHARS) for _ in range(rng.randint(2, 3)))


def _amount_text(rng: random.Random, lang: str, value: int) -> str:
    """A price as people write it: 1500, 1,500, 1.5k, 3千, 2萬."""
    r = rng.random()
    if value >= 1000 and r < 0.3:
        return f"{value:,}"
    if lang == "en" and value % 500 == 0 and value >= 1000 and r < 0.5:
        return f"{value / 1000:g}k"
    if lang != "en" and value % 10000 == 0 and r < 0.6:
        return f"{value // 10000}萬"
    if lang != "en" and value % 1000 == 0 and value < 10000 and r < 0.6:
        return f"{value // 1000}千"
    return str(value)


def _extraction_listing(rng: random.Random, lang: str) -> tuple[str, dict]:
    """A second-hand listing: product words, brand and price copied, colour named in English."""
    _, item = _product(rng, lang)
    if rng.random() < 0.3:
        item = (coined(rng, lang).lower() + " " + item) if lang == "en" else coined(rng, lang) + item
    brand = rng.choice(BRANDS) if rng.random() < 0.5 else coined(rng, lang)
    k = rng.randrange(len(COLORS_EN))
    price = rng.choice([rng.randint(1, 99) * 10, rng.randint(1, 50) * 500, rng.randint(1, 20) * 10000, rng.randint(5, 999)])
    used, free = rng.random() < 0.5, rng.random() < 0.4
    amount = _amount_text(rng, lang, price)
    if lang == "en":
        text = (f"{'Selling my used' if used else 'Brand new'} {COLORS_EN[k]} {brand} {item}, asking {amount}"
                + (", free shipping." if free else "."))
    else:
        text = f"{'出售二手' if used else '全新'}{COLORS_ZH[k]}{brand}{item}，售價{amount}元" + ("，免運。" if free else "。")
    return text, {"item": item, "brand": brand, "color": COLORS_EN[k], "price": price, "used": used,
                  "ships_free": free or None}


def _extraction_names(rng: random.Random, lang: str) -> tuple[str, dict]:
    """Pick the product names out of a sentence, exactly as written."""
    names = [coined(rng, lang) + ("" if lang != "en" else " ") + _product(rng, lang)[1] for _ in range(rng.randint(1, 3))]
    text = ("We stock " + ", ".join(names) + " this week." if lang == "en"
            else "本週有貨：" + "、".join(names) + "。")
    return text, {"products": names, "count": len(names)}


EXTRACTORS = [_extraction_event, _extraction_contact, _extraction_order, _extraction_review, _extraction_listing,
              _extraction_listing, _extraction_names, _extraction_names]


def extraction(rng: random.Random, lang: str) -> str:
    """A chat asking for a record as JSON; values are copied from the user's text."""
    text, record = rng.choice(EXTRACTORS)(rng, lang)
    keys = ", ".join(record)
    system = rng.choice([f"Extract the details as JSON with the keys {keys}.",
                         f"Reply with a JSON object ({keys}). Use null when unknown.",
                         f"請把內容整理成JSON，欄位：{keys}。"])
    return chat([("system", system), ("user", text), ("assistant", json.dumps(record, ensure_ascii=False))])


GENRES: list[tuple[Callable[[random.Random, str], str], float, bool]] = [
    # (generator, weight, is_chat)
    (description, 0.16, False),
    (review, 0.12, False),
    (chitchat, 0.12, True),
    (json_record, 0.15, False),
    (search_page, 0.05, False),
    (extraction, 0.40, True),
]


def documents(n: int, seed: int = 0) -> list[str]:
    """``n`` documents of the mix, about half English and half Traditional Chinese."""
    rng = random.Random(seed)
    gens, weights = [g for g, _, _ in GENRES], [w for _, w, _ in GENRES]
    chats = {g for g, _, c in GENRES if c}
    out = []
    for _ in range(n):
        gen = rng.choices(gens, weights)[0]
        text = gen(rng, rng.choice(["en", "zh-TW"]))
        out.append(text if gen in chats else BOS + text + EOT)
    return out
