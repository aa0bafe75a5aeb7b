"""Seeded synthetic shopping queries (en, zh-TW) with gold search parameters.

Every gold value is derivable from the query text: ``keywords``, ``brands`` and ``sizes`` are exact
substrings of the query (a query written in lower case has them in lower case too), colour words map to the
contract's enum, prices are numbers in the query's currency (``currency`` is null when the query names none).
Typos only touch template words, never a value that is copied.

Example ``i`` of seed ``s`` depends only on ``(s, i, langs)``, so ``generate(n)`` is a prefix of
``generate(m)`` for ``m > n``. Different seeds give different examples, but short queries (order status,
small talk) can repeat across seeds; :func:`held_out` drops those so an evaluation set never holds a
training query.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from specops.errors import SpecopsError
from specops.files import read_jsonl
from specops.task import lexicon as lx
from specops.task.schema import FIELDS

LANGS = ("en", "zh-TW")
INTENT_WEIGHTS = {"search": 45, "recommend": 15, "compare": 12, "order_status": 10, "return_request": 10, "other": 8}
# Apparel and shoes are the bulk of shopping queries and the ones with sizes.
CATEGORY_WEIGHTS = {name: 3 if name in ("clothing", "shoes") else 1 for name in lx.CATEGORIES}
CONSUMABLES = frozenset({"beauty", "grocery", "pets", "health"})  # never sold used or refurbished
MAX_CONSTRAINTS = 4  # keeps queries short: typically <= 25 words / 40 CJK characters


@dataclass(frozen=True)
class Example:
    id: str
    lang: str
    query: str
    gold: dict

    def to_json(self) -> dict:
        return {"id": self.id, "lang": self.lang, "query": self.query, "gold": self.gold}


def empty_params(intent: str) -> dict:
    """Parameters with every constraint absent."""
    params = {k: None for k in FIELDS}
    params.update(intent=intent, keywords=[], brands=[], colors=[], sizes=[], sort="relevance")
    return params


def _weighted(rng: random.Random, weights: dict):
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _usual(rng: random.Random, options: Sequence[str]):
    """The first option is the usual phrasing ("under $80"): it gets 40 % on top of a uniform share."""
    return options[0] if rng.random() < 0.4 else rng.choice(options)


def _join_zh(parts: list[str]) -> str:
    """Chinese needs no spaces, except between two Latin words ("Razer Switch遊戲")."""
    out = ""
    for part in parts:
        if out and out[-1].isascii() and out[-1].isalnum() and part[0].isascii() and part[0].isalnum():
            out += " "
        out += part
    return out


def _typo(rng: random.Random, template: str) -> str:
    """Misspell one literal word (4+ letters) of a template; placeholders and values are never touched."""
    words = template.split(" ")
    spots = [i for i, w in enumerate(words) if w.isalpha() and w.isascii() and len(w) >= 4]
    if not spots:
        return template
    i = rng.choice(spots)
    w = words[i]
    j = rng.randrange(1, len(w) - 1)
    op = rng.randrange(3)
    if op == 0 and w[j] == w[j + 1]:
        op = 1  # swapping equal letters would change nothing
    if op == 0:
        w = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    elif op == 1:
        w = w[:j] + w[j + 1:]
    else:
        w = w[:j] + w[j] + w[j:]
    words[i] = w
    return " ".join(words)


def _zh_numeral(n: int) -> str:
    """Chinese numeral for 0 < n < 10^8 as written in Taiwan (兩千, 一萬兩千, 三千零五十)."""
    digits = "零一二三四五六七八九"

    def under_10k(m: int, leading: bool) -> str:
        out, zero = "", False
        for unit, div in (("千", 1000), ("百", 100), ("十", 10), ("", 1)):
            d = (m // div) % 10
            if d == 0:
                zero = bool(out)
                continue
            if zero:
                out += "零"
                zero = False
            if not (d == 1 and unit == "十" and not out and leading):  # 十五, not 一十五
                out += "兩" if d == 2 and unit in ("千", "百") and not out else digits[d]
            out += unit
        return out

    high, low = divmod(n, 10000)
    if not high:
        return under_10k(low, True)
    text = ("兩" if high == 2 else under_10k(high, True)) + "萬"
    if low:
        text += ("零" if low < 1000 else "") + under_10k(low, False)
    return text


def _num_text(rng: random.Random, lang: str, value: float, digits_only: bool = False) -> str:
    """One of the ways a price number is written: 1500, 1,500, 1.5k, 一千五百, 3千, 2萬."""
    if value != int(value):
        return f"{value:.2f}"
    v = int(value)
    r = rng.random()
    if digits_only:  # after a symbol such as NT$
        return str(v)
    if lang == "en":
        if v >= 1000 and r < 0.3:
            return f"{v:,}"
        if v >= 1000 and v % 500 == 0 and r < 0.4:
            return f"{v / 1000:g}k"
        return str(v)
    if v % 100 == 0 and r < 0.35:
        return _zh_numeral(v)
    if v % 10000 == 0 and r < 0.5:
        return f"{v // 10000}萬"
    if v % 1000 == 0 and v < 10000 and r < 0.5:
        return f"{v // 1000}千"
    if v >= 1000 and r < 0.6:
        return f"{v:,}"
    return str(v)


def _price(rng: random.Random, lang: str, currency: str | None) -> tuple[str, float | None, float | None]:
    values = lx.PRICE_VALUES[currency or lx.DEFAULT_PRICE_CURRENCY[lang]]
    kind = _weighted(rng, {"max": 50, "min": 20, "range": 30})
    pre, suf = _usual(rng, lx.CURRENCY_MARKS[lang][currency])
    form = _usual(rng, lx.PRICE_FORMS[lang][kind])
    symbol = lang != "en" and pre.endswith("$")
    if kind == "range":
        a, b = sorted(rng.sample(values, 2))
        shared = rng.random() < 0.5  # "$100-250", "1500到3000元" vs "$100-$250"
        ta = pre + _num_text(rng, lang, a, symbol) + ("" if shared else suf)
        tb = ("" if shared else pre) + _num_text(rng, lang, b, symbol and not shared) + suf
        return form.format(a=ta, b=tb), a, b
    a = rng.choice(values)
    if currency in ("USD", "EUR", "GBP", None) and lang == "en" and a <= 100 and rng.random() < 0.15:
        a = round(a - 0.01, 2)  # 79.99
    text = form.format(a=pre + _num_text(rng, lang, a, symbol) + suf)
    return (text, None, a) if kind == "max" else (text, a, None)


def _rating(rng: random.Random, lang: str) -> tuple[str, float]:
    r = rng.choice(lx.RATINGS)
    if lang == "en":
        shown = {3: "three", 4: "four"}.get(r) if rng.random() < 0.2 else None
    else:
        shown = {3: "三", 4: "四"}.get(r) if rng.random() < 0.4 else None
    return rng.choice(lx.RATING_FORMS[lang]).format(r=shown or f"{r:g}"), r


def _sizes(rng: random.Random, lang: str, kind: str) -> tuple[str, list[str]]:
    pool = lx.SIZES[kind]
    forms = lx.SIZE_FORMS[lang]
    if kind == "apparel" and rng.random() < 0.2:
        s, t = sorted(rng.sample(pool, 2), key=pool.index)
        return rng.choice(forms["two"]).format(s=s, t=t), [s, t]
    s = rng.choice(pool)
    if kind == "shoe" and not s[0].isdigit():
        return s, [s]  # "US 9", "EU 42" stand alone
    return rng.choice(forms[kind]).format(s=s), [s]


def _shopping(rng: random.Random, lang: str, intent: str) -> tuple[str, dict]:
    cat_name = _weighted(rng, CATEGORY_WEIGHTS)
    cat = lx.CATEGORIES[cat_name]
    zh = lang != "en"
    product = rng.choice(cat.products)[zh]
    brands = cat.brands[lang]
    g = empty_params(intent)
    g["category"] = cat_name
    tail: list[str] = []  # constraint phrases after (or one before) the lead

    slots = {s for s, p in (("brand", 0.45), ("feature", 0.3), ("color", 0.35 if cat.colored else 0),
                            ("size", 0.6 if cat.sizes else 0),
                            ("condition", 0 if cat_name in CONSUMABLES else 0.2), ("price", 0.5),
                            ("rating", 0.15), ("in_stock", 0.12), ("free_shipping", 0.15), ("sort", 0.3))
             if rng.random() < p}
    if intent == "compare":
        slots -= {"brand", "size", "condition"}
    if len(slots) > MAX_CONSTRAINTS:
        slots = set(rng.sample(sorted(slots), MAX_CONSTRAINTS))

    prefix: list[str] = []  # modifiers before the product, in order
    if "condition" in slots:
        cond = rng.choice(list(lx.CONDITIONS[lang]))
        adjs, tails = lx.CONDITIONS[lang][cond]
        if rng.random() < 0.7:
            prefix.append(rng.choice(adjs))
        else:
            tail.append(rng.choice(tails))
        g["condition"] = cond
    if "size" in slots and cat.sizes == "screen":
        size = rng.choice(lx.SIZES["screen"][lang])
        prefix.append(size)
        g["sizes"] = [size]
    color_words = list(lx.COLORS[lang])
    if "color" in slots:
        picked = rng.sample(color_words, 2 if rng.random() < 0.2 else 1)
        if len({lx.COLORS[lang][c] for c in picked}) < len(picked):
            picked = picked[:1]
        g["colors"] = [lx.COLORS[lang][c] for c in picked]
        if len(picked) == 2:
            tail.append(rng.choice(lx.COLOR_FORMS[lang]["two"]).format(c=picked[0], d=picked[1]))
        elif rng.random() < 0.7:
            prefix.append(picked[0])
        else:
            tail.append(rng.choice(lx.COLOR_FORMS[lang]["one"]).format(c=picked[0]))
    brand_after = None
    if "brand" in slots:
        picked = rng.sample(brands, 2 if rng.random() < 0.1 else 1)
        g["brands"] = picked
        joined = (" or " if not zh else "或").join(picked)
        if len(picked) == 1 and lx.BRAND_AFTER[lang] and rng.random() < 0.25:
            brand_after = (rng.choice(lx.BRAND_AFTER[lang]), picked[0])
        else:
            prefix.append(joined)
    if zh and len(prefix) > 1 and rng.random() < 0.5:  # 黑色Nike慢跑鞋 / Nike黑色慢跑鞋
        prefix[-1], prefix[-2] = prefix[-2], prefix[-1]
    if "feature" in slots:
        features = [f[zh] for f in cat.features if f[zh] not in product and product not in f[zh]]
        if features:
            feature = rng.choice(features)
            prefix.append(feature)
            g["keywords"].append(feature)
    g["keywords"].append(product)
    phrase = _join_zh(prefix + [product]) if zh else " ".join(prefix + [product])
    if brand_after:
        form, brand = brand_after
        phrase = form.format(p=phrase, b=brand)

    if "size" in slots and cat.sizes != "screen":
        text, g["sizes"] = _sizes(rng, lang, cat.sizes)
        tail.append(text)
    if "price" in slots:
        currency = _weighted(rng, lx.CURRENCY_WEIGHTS[lang])
        text, g["price_min"], g["price_max"] = _price(rng, lang, currency)
        g["currency"] = currency
        tail.append(text)
    if "rating" in slots:
        text, g["rating_min"] = _rating(rng, lang)
        tail.append(text)
    if "in_stock" in slots:
        tail.append(rng.choice(lx.IN_STOCK[lang]))
        g["in_stock"] = True
    if "free_shipping" in slots:
        tail.append(rng.choice(lx.FREE_SHIPPING[lang]))
        g["free_shipping"] = True
    if "sort" in slots:
        g["sort"] = rng.choice(list(lx.SORTS[lang]))
        tail.append(rng.choice(lx.SORTS[lang][g["sort"]]))

    lead = rng.choice(lx.LEADS[lang][intent])
    if not zh and rng.random() < 0.1:
        lead = _typo(rng, lead)
    if intent == "compare":
        b1, b2 = rng.sample(brands, 2)
        g["brands"] = [b1, b2]  # every compare template names b1 first
        lead_text = lead.format(p=phrase, b1=b1, b2=b2)
    else:
        lead_text = lead.format(p=phrase)
    rng.shuffle(tail)
    sep = rng.choice(["，", " ", "、", "，"] if zh else [", ", " ", ", "])
    parts = [lead_text] + tail
    if tail and rng.random() < 0.15:  # a constraint first: "三千元以下，想買慢跑鞋"
        parts = [tail[0], lead_text] + tail[1:]
    query = sep.join(parts)
    if not zh and rng.random() < 0.2:
        query += "?" if intent != "search" else "."
    return query, g


def _order_number(rng: random.Random) -> str:
    return rng.choice(["", "", "A", "TW"]) + str(rng.randrange(10 ** 4, 10 ** 8))


def _service(rng: random.Random, lang: str, intent: str) -> tuple[str, dict]:
    """Order status, returns and small talk: mostly empty parameters, sort relevance."""
    g = empty_params(intent)
    typo = lang == "en" and rng.random() < 0.15
    if intent == "order_status":
        template = rng.choice(lx.ORDER_STATUS[lang])
        template = _typo(rng, template) if typo else template
        query = template.format(num=_order_number(rng))
    elif intent == "return_request":
        template = rng.choice(lx.RETURNS[lang])
        template = _typo(rng, template) if typo else template
        fill = {"num": _order_number(rng)}
        if "{p}" in template:
            cat_name = rng.choice(list(lx.CATEGORIES))
            cat = lx.CATEGORIES[cat_name]
            product = rng.choice(cat.products)[lang != "en"]
            fill["p"] = product
            g.update(category=cat_name, keywords=[product])
            if rng.random() < 0.4:
                brand = rng.choice(cat.brands[lang])
                fill["p"] = (brand + " " + product) if lang == "en" else _join_zh([brand, product])
                g["brands"] = [brand]
        query = template.format(**fill)
    else:
        template = rng.choice(lx.OTHER[lang])
        template = _typo(rng, template) if typo else template
        query = template.format(**{k: rng.choice(v) for k, v in lx.OTHER_FILL[lang].items()})
    if lang == "en" and rng.random() < 0.4:
        query += "?"
    elif lang != "en" and rng.random() < 0.4:
        query += "？"
    return query, g


def _lowercase(query: str, gold: dict) -> tuple[str, dict]:
    """Casual all-lower-case typing; copied values follow so they stay substrings."""
    gold = dict(gold, keywords=[k.lower() for k in gold["keywords"]], brands=[b.lower() for b in gold["brands"]],
                sizes=[s.lower() for s in gold["sizes"]])
    return query.lower(), gold


def example(seed: int, index: int, langs: Sequence[str] = LANGS) -> Example:
    """Example ``index`` of the stream for ``seed``; depends on nothing else."""
    rng = random.Random(f"{seed}:{index}:{','.join(langs)}")
    lang = rng.choice(list(langs))
    intent = _weighted(rng, INTENT_WEIGHTS)
    if intent in ("search", "recommend", "compare"):
        query, gold = _shopping(rng, lang, intent)
    else:
        query, gold = _service(rng, lang, intent)
    if lang == "en" and rng.random() < 0.2:
        query, gold = _lowercase(query, gold)
    return Example(id=f"{seed}-{index}", lang=lang, query=query, gold=gold)


def _check_langs(langs: Sequence[str]) -> None:
    bad = [lang for lang in langs if lang not in LANGS]
    if bad or not langs:
        raise SpecopsError(f"languages must be a non-empty subset of {', '.join(LANGS)}; got {', '.join(langs) or 'none'}")


def generate(n: int, seed: int = 0, langs: Sequence[str] = LANGS) -> list[Example]:
    """``n`` examples, deterministic for a given (n, seed, langs)."""
    _check_langs(langs)
    return [example(seed, i, langs) for i in range(n)]


def held_out(n: int, seed: int, exclude: Iterable[Example], langs: Sequence[str] = LANGS) -> list[Example]:
    """``n`` examples from ``seed`` whose queries (case-insensitively) are not among ``exclude``'s queries."""
    _check_langs(langs)
    seen = {e.query.casefold() for e in exclude}
    out: list[Example] = []
    i = 0
    while len(out) < n:
        e = example(seed, i, langs)
        i += 1
        if e.query.casefold() not in seen:
            seen.add(e.query.casefold())
            out.append(e)
        if i > 100 * (n + 100):
            raise SpecopsError(f"could not find {n} queries unseen in the excluded set")
    return out


def write_examples(examples: Iterable[Example], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for e in examples:
            f.write(json.dumps(e.to_json(), ensure_ascii=False) + "\n")


def read_examples(path: str | Path) -> list[Example]:
    """Examples from a JSONL file written by :func:`write_examples`; a bad line raises SpecopsError naming it."""
    rows, _ = read_jsonl(path)
    out = []
    for no, rec in rows:
        try:
            out.append(Example(id=str(rec["id"]), lang=rec["lang"], query=rec["query"], gold=rec["gold"]))
        except KeyError as e:
            raise SpecopsError(f"{path}:{no}: not an example line (no {e})") from None
        if not isinstance(out[-1].gold, dict) or not isinstance(out[-1].query, str):
            raise SpecopsError(f"{path}:{no}: 'query' must be a string and 'gold' an object")
    return out
