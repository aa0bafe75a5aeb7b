"""Vocabulary for the synthetic queries: products per category, brands, colours and phrasings (en, zh-TW).

Tables are written as compact strings ("en=zh|en=zh") so a category fits on a few lines.
Every phrasing holds the slot value as a ``{placeholder}`` so the value is copied, never paraphrased.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Category:
    products: tuple[tuple[str, str], ...]  # (en, zh) noun phrases, copied into keywords verbatim
    brands: dict[str, tuple[str, ...]]  # lang -> brand names as written in that language
    features: tuple[tuple[str, str], ...]  # (en, zh) modifiers, copied into keywords verbatim
    sizes: str | None  # size kind: apparel, shoe, screen
    colored: bool


def _pairs(spec: str) -> tuple[tuple[str, str], ...]:
    return tuple(tuple(p.split("=")) for p in spec.split("|"))  # type: ignore[misc]


def _cat(products: str, brands_en: str, brands_zh: str, features: str, sizes: str | None = None,
         colored: bool = True) -> Category:
    return Category(_pairs(products), {"en": tuple(brands_en.split("|")), "zh-TW": tuple(brands_zh.split("|"))},
                    _pairs(features), sizes, colored)


CATEGORIES: dict[str, Category] = {
    "phones": _cat("smartphone=智慧型手機|phone case=手機殼|phone charger=手機充電器|screen protector=螢幕保護貼|android phone=安卓手機",
                   "Apple|Samsung|Google|Xiaomi|OPPO|ASUS", "Apple|Samsung|小米|華碩|OPPO|Google",
                   "5G=5G|waterproof=防水|fast charging=快充|magnetic=磁吸"),
    "computers": _cat("laptop=筆電|gaming laptop=電競筆電|mechanical keyboard=機械鍵盤|wireless mouse=無線滑鼠|monitor=螢幕|tablet=平板",
                      "Apple|Dell|Lenovo|ASUS|Acer|HP|Logitech", "華碩|宏碁|Lenovo|羅技|Apple|Dell",
                      "lightweight=輕薄|ergonomic=人體工學|quiet=靜音|portable=便攜"),
    "audio": _cat("wireless earbuds=無線耳機|headphones=耳罩式耳機|bluetooth speaker=藍牙喇叭|soundbar=聲霸|noise cancelling headphones=降噪耳機",
                  "Sony|Bose|JBL|Apple|Sennheiser|Audio-Technica", "Sony|Bose|JBL|Apple|鐵三角|森海塞爾",
                  "noise cancelling=降噪|waterproof=防水|wireless=無線|open-ear=開放式"),
    "cameras": _cat("mirrorless camera=無反相機|action camera=運動攝影機|camera lens=相機鏡頭|tripod=腳架|instant camera=拍立得",
                    "Canon|Nikon|Sony|Fujifilm|GoPro", "Canon|Nikon|Sony|富士|GoPro",
                    "waterproof=防水|compact=輕巧|full-frame=全片幅"),
    "tv": _cat("smart tv=智慧電視|4K TV=4K電視|OLED TV=OLED電視|projector=投影機|tv wall mount=電視壁掛架",
               "Samsung|LG|Sony|TCL|Panasonic", "Samsung|LG|Sony|大同|國際牌",
               "4K=4K|120Hz=120Hz|HDR=HDR", sizes="screen", colored=False),
    "gaming": _cat("game controller=遊戲手把|gaming headset=電競耳機|Switch game=Switch遊戲|gaming chair=電競椅|PS5 controller=PS5手把",
                   "Sony|Nintendo|Razer|Logitech|Microsoft", "Sony|任天堂|Razer|羅技|微軟",
                   "wireless=無線|RGB=RGB|ergonomic=人體工學"),
    "home": _cat("air purifier=空氣清淨機|robot vacuum=掃地機器人|desk lamp=檯燈|dehumidifier=除濕機|electric fan=電風扇",
                 "Dyson|Xiaomi|Philips|Panasonic|Sharp", "Dyson|小米|飛利浦|國際牌|夏普",
                 "quiet=靜音|smart=智慧|energy saving=節能"),
    "kitchen": _cat("rice cooker=電子鍋|air fryer=氣炸鍋|coffee maker=咖啡機|blender=果汁機|knife set=刀具組",
                    "Zojirushi|Tatung|Philips|Tefal|Breville", "象印|大同|飛利浦|特福|虎牌",
                    "stainless steel=不鏽鋼|large capacity=大容量|compact=小型"),
    "furniture": _cat("office chair=辦公椅|standing desk=升降桌|sofa=沙發|bookshelf=書櫃|bed frame=床架",
                      "IKEA|Herman Miller|Steelcase|HON", "IKEA|Herman Miller|宜得利|特力屋",
                      "ergonomic=人體工學|wooden=實木|foldable=折疊"),
    "clothing": _cat("t-shirt=T恤|hoodie=帽T|down jacket=羽絨外套|jeans=牛仔褲|dress=洋裝|rain jacket=雨衣",
                     "Uniqlo|Nike|Adidas|Zara|Levi's|H&M", "Uniqlo|Nike|Adidas|Zara|Levi's|GU",
                     "waterproof=防水|oversized=寬版|cotton=純棉|lightweight=輕量", sizes="apparel"),
    "shoes": _cat("running shoes=慢跑鞋|sneakers=球鞋|hiking boots=登山鞋|sandals=涼鞋|basketball shoes=籃球鞋",
                  "Nike|Adidas|New Balance|ASICS|Puma|Skechers", "Nike|Adidas|New Balance|亞瑟士|Puma|Skechers",
                  "waterproof=防水|lightweight=輕量|wide=寬楦", sizes="shoe"),
    "bags": _cat("backpack=後背包|tote bag=托特包|suitcase=行李箱|crossbody bag=斜背包|laptop bag=電腦包",
                 "Samsonite|Herschel|Longchamp|Coach|Rimowa", "Samsonite|Herschel|Longchamp|Coach|Porter",
                 "waterproof=防水|lightweight=輕量|anti-theft=防盜"),
    "beauty": _cat("sunscreen=防曬乳|lipstick=口紅|face moisturizer=保濕乳液|shampoo=洗髮精|perfume=香水",
                   "Shiseido|L'Oreal|Estee Lauder|Kiehl's|Clinique", "資生堂|L'Oreal|雅詩蘭黛|Kiehl's|倩碧",
                   "fragrance-free=無香料|long-lasting=持久|SPF50=SPF50", colored=False),
    "sports": _cat("yoga mat=瑜珈墊|dumbbells=啞鈴|tennis racket=網球拍|road bike=公路車|basketball=籃球",
                   "Decathlon|Wilson|Yonex|Giant|Spalding", "迪卡儂|Wilson|Yonex|捷安特|Spalding",
                   "non-slip=止滑|adjustable=可調式|lightweight=輕量"),
    "outdoors": _cat("tent=帳篷|sleeping bag=睡袋|camping stove=露營爐|hiking backpack=登山背包|trekking poles=登山杖",
                     "The North Face|Coleman|Patagonia|Snow Peak|Columbia", "The North Face|Coleman|Patagonia|Snow Peak|Columbia",
                     "waterproof=防水|ultralight=超輕量|4-person=四人"),
    "toys": _cat("LEGO set=樂高積木|building blocks=積木|plush toy=絨毛娃娃|RC car=遙控車|board game=桌遊",
                 "LEGO|Hasbro|Mattel|Bandai|Hape", "LEGO|孩之寶|美泰兒|萬代|Hape",
                 "educational=益智|wooden=木製"),
    "books": _cat("cookbook=食譜|novel=小說|programming book=程式設計書|comic book=漫畫|children's book=童書",
                  "Penguin|O'Reilly|HarperCollins", "天下文化|遠流|歐萊禮",
                  "beginner=入門|English=英文|illustrated=圖解", colored=False),
    "grocery": _cat("coffee beans=咖啡豆|green tea=綠茶|olive oil=橄欖油|instant noodles=泡麵|snacks=零食",
                    "Nestle|Lipton|Kirkland|Lavazza", "雀巢|立頓|統一|義美",
                    "organic=有機|sugar-free=無糖|decaf=低咖啡因", colored=False),
    "pets": _cat("dog food=狗飼料|cat litter=貓砂|cat tree=貓跳台|dog leash=狗牽繩|pet bed=寵物床",
                 "Royal Canin|Purina|Hill's|Orijen", "皇家|Purina|希爾思|Orijen",
                 "grain-free=無穀|senior=高齡|large=大型", colored=False),
    "automotive": _cat("dash cam=行車記錄器|car charger=車充|tire inflator=打氣機|car phone mount=車用手機架|car vacuum=車用吸塵器",
                       "Garmin|Bosch|Michelin|Anker", "Garmin|Bosch|Mio|Anker",
                       "wireless=無線|4K=4K|portable=攜帶式"),
    "baby": _cat("stroller=嬰兒推車|diapers=尿布|baby bottle=奶瓶|car seat=汽車安全座椅|baby carrier=揹巾",
                 "Pampers|Combi|Chicco|Pigeon", "幫寶適|Combi|Chicco|貝親",
                 "lightweight=輕量|organic=有機|foldable=可折疊"),
    "health": _cat("vitamin C=維他命C|blood pressure monitor=血壓計|fish oil=魚油|electric toothbrush=電動牙刷|massage gun=按摩槍",
                   "Omron|Centrum|Philips|Oral-B", "歐姆龍|善存|飛利浦|Oral-B",
                   "rechargeable=充電式|sugar-free=無糖|portable=攜帶式", colored=False),
    "other": _cat("umbrella=雨傘|gift card=禮物卡|stationery set=文具組|wall calendar=月曆",
                  "Muji|Totes|Moleskine", "無印良品|Moleskine|三麗鷗",
                  "foldable=折疊|large=大"),
}

SIZES = {
    "apparel": ("XS", "S", "M", "L", "XL", "XXL"),
    "shoe": ("7", "8", "9", "9.5", "10", "11", "38", "40", "42", "44", "US 9", "US 10", "EU 42", "UK 8"),
    "screen": {"en": ("43 inch", "55 inch", "65 inch", "75 inch", "55-inch", "65-inch"),
               "zh-TW": ("43吋", "55吋", "65吋", "75吋")},
}

# Colour words per language mapped to the contract's enum.
COLORS = {
    "en": {"black": "black", "white": "white", "gray": "gray", "grey": "gray", "silver": "silver", "gold": "gold",
           "red": "red", "pink": "pink", "orange": "orange", "yellow": "yellow", "green": "green", "blue": "blue",
           "navy": "navy", "navy blue": "navy", "purple": "purple", "brown": "brown", "beige": "beige"},
    "zh-TW": {"黑色": "black", "黑": "black", "白色": "white", "白": "white", "灰色": "gray", "銀色": "silver",
              "金色": "gold", "紅色": "red", "粉紅色": "pink", "粉色": "pink", "橘色": "orange", "橙色": "orange",
              "黃色": "yellow", "綠色": "green", "藍色": "blue", "深藍色": "navy", "海軍藍": "navy", "紫色": "purple",
              "咖啡色": "brown", "棕色": "brown", "米色": "beige"},
}

# Currency marks as (prefix, suffix) around the number.
CURRENCY_MARKS = {
    "en": {None: [("", "")],
           "USD": [("$", ""), ("", " dollars"), ("", " bucks"), ("", " USD"), ("USD ", ""), ("US$", "")],
           "EUR": [("€", ""), ("", " euros"), ("", " EUR"), ("EUR ", ""), ("", "€")],
           "GBP": [("£", ""), ("", " pounds"), ("", " GBP"), ("GBP ", "")],
           "JPY": [("¥", ""), ("", " yen"), ("", " JPY"), ("JPY ", "")],
           "CNY": [("", " yuan"), ("RMB ", ""), ("", " RMB"), ("CNY ", "")],
           "TWD": [("NT$", ""), ("", " NTD"), ("NTD ", ""), ("", " TWD"), ("", " Taiwan dollars")]},
    "zh-TW": {None: [("", "")],
              "TWD": [("", "元"), ("", "塊"), ("NT$", ""), ("台幣", ""), ("", "元台幣")],
              "USD": [("", "美金"), ("", "美元"), ("美金", "")],
              "JPY": [("", "日圓"), ("日幣", ""), ("", "日幣")],
              "EUR": [("", "歐元")], "GBP": [("", "英鎊")],
              "CNY": [("人民幣", ""), ("", "人民幣")]},
}
CURRENCY_WEIGHTS = {
    "en": {"USD": 40, None: 20, "EUR": 10, "GBP": 10, "JPY": 7, "CNY": 6, "TWD": 7},
    "zh-TW": {"TWD": 55, None: 20, "USD": 10, "JPY": 7, "EUR": 3, "CNY": 3, "GBP": 2},
}
_WESTERN = (10, 15, 20, 25, 30, 40, 50, 60, 75, 80, 100, 120, 150, 200, 250, 300, 400, 500, 600, 800, 1000, 1200,
            1500, 2000)
_TWD = (300, 500, 800, 1000, 1500, 2000, 2500, 3000, 5000, 8000, 10000, 12000, 15000, 20000, 30000, 50000)
PRICE_VALUES = {"USD": _WESTERN, "EUR": _WESTERN, "GBP": _WESTERN, "TWD": _TWD,
                "JPY": (1000, 2000, 3000, 5000, 8000, 10000, 15000, 20000, 30000, 50000, 80000, 100000),
                "CNY": (50, 100, 200, 300, 500, 800, 1000, 1500, 2000, 3000, 5000)}
# A price without a currency takes numbers typical of the language's home market.
DEFAULT_PRICE_CURRENCY = {"en": "USD", "zh-TW": "TWD"}

PRICE_FORMS = {
    "en": {"max": ("under {a}", "below {a}", "less than {a}", "{a} or less", "no more than {a}", "at most {a}",
                   "max {a}", "up to {a}", "budget {a}", "{a} max", "not over {a}", "cheaper than {a}", "{a} or under"),
           "min": ("over {a}", "above {a}", "at least {a}", "{a} or more", "{a}+", "more than {a}", "starting at {a}",
                   "min {a}", "{a} and up", "no less than {a}"),
           "range": ("between {a} and {b}", "{a}-{b}", "{a} to {b}", "from {a} to {b}", "{a} - {b}", "{a}~{b}",
                     "in the {a}-{b} range", "priced {a} to {b}")},
    "zh-TW": {"max": ("{a}以下", "{a}以內", "不超過{a}", "預算{a}", "低於{a}", "最多{a}", "預算{a}以內", "{a}內"),
              "min": ("{a}以上", "至少{a}", "高於{a}", "超過{a}", "{a}起"),
              "range": ("{a}到{b}", "{a}~{b}", "{a}-{b}", "介於{a}和{b}之間", "{a}至{b}", "{a}到{b}之間",
                        "預算{a}到{b}")},
}

RATINGS = (3, 3.5, 4, 4.5)
RATING_FORMS = {
    "en": ("{r} stars and up", "rated {r}+", "at least {r} stars", "{r}-star or better", "{r} stars or higher",
           "{r}+ stars", "rating {r} or above", "minimum {r} stars"),
    "zh-TW": ("{r}星以上", "{r}顆星以上", "評價{r}星以上", "評分{r}分以上", "至少{r}顆星"),
}

SORTS = {
    "en": {"price_asc": ("cheapest first", "sort by price low to high", "lowest price first", "price ascending"),
           "price_desc": ("most expensive first", "price high to low", "sort by price descending", "priciest first"),
           "rating_desc": ("best rated first", "sort by rating", "highest rated first", "top rated first"),
           "newest": ("newest first", "latest arrivals first", "sort by newest", "most recent first"),
           "best_selling": ("best sellers first", "most popular first", "sort by best selling", "top selling first")},
    "zh-TW": {"price_asc": ("價格由低到高", "依價格低到高排序", "便宜的排前面", "從最便宜的開始"),
              "price_desc": ("價格由高到低", "依價格高到低排序", "貴的排前面"),
              "rating_desc": ("評價最高的排前面", "依評分排序", "評分由高到低", "評價高的優先"),
              "newest": ("最新上架", "依上架時間排序", "最新上市的優先", "最新的排前面"),
              "best_selling": ("熱銷排行", "銷量最高", "依銷量排序", "最暢銷的")},
}

CONDITIONS = {  # (adjectives before the product, phrases after it)
    "en": {"new": (("brand new", "new"), ("new only", "new condition only", "must be brand new")),
           "used": (("used", "second-hand", "pre-owned"), ("used is fine", "used ok", "second-hand is fine")),
           "refurbished": (("refurbished", "renewed"), ("refurbished is ok", "refurbished only", "renewed is fine"))},
    "zh-TW": {"new": (("全新",), ("要全新的", "全新品")),
              "used": (("二手",), ("二手的也可以", "二手就好")),
              "refurbished": (("整新", "福利品"), ("福利品也可以", "整新機也行"))},
}

IN_STOCK = {"en": ("in stock", "in stock only", "must be in stock", "available now", "currently in stock"),
            "zh-TW": ("有現貨", "現貨", "要有庫存", "有庫存的", "現貨供應")}
FREE_SHIPPING = {"en": ("free shipping", "with free shipping", "free delivery", "ships free", "no shipping fee"),
                 "zh-TW": ("免運", "要免運", "免運費", "運費全免")}

SIZE_FORMS = {
    "en": {"apparel": ("size {s}", "in {s}", "size {s}", "{s}"), "shoe": ("size {s}", "in size {s}"),
           "two": ("size {s} or {t}", "{s} or {t}")},
    "zh-TW": {"apparel": ("{s}號", "尺寸{s}", "要{s}的"), "shoe": ("{s}號", "尺寸{s}"), "two": ("{s}或{t}號", "尺寸{s}或{t}")},
}
COLOR_FORMS = {"en": {"one": ("in {c}", "{c} color", "color {c}"), "two": ("in {c} or {d}", "{c} or {d}")},
               "zh-TW": {"one": ("{c}的", "要{c}", "顏色{c}"), "two": ("{c}或{d}", "顏色{c}或{d}")}}

LEADS = {
    "en": {"search": ("find me {p}", "looking for {p}", "show me {p}", "I want {p}", "i need {p}", "search for {p}",
                      "{p}", "any {p}", "do you have {p}", "where can I buy {p}", "shopping for {p}", "get me {p}",
                      "I'm looking for {p}", "need {p}", "buy {p}", "browse {p}"),
           "recommend": ("recommend {p}", "can you recommend {p}", "what's the best {p}", "suggest {p}",
                         "which {p} should I get", "any good {p} you'd recommend", "need a recommendation for {p}",
                         "what {p} do you suggest", "top picks for {p}", "help me choose {p}"),
           "compare": ("compare {b1} and {b2} {p}", "{b1} vs {b2} {p}", "{b1} or {b2} {p}, which is better",
                       "difference between {b1} and {b2} {p}", "compare {p} from {b1} and {b2}",
                       "{b1} {p} vs {b2}", "is {b1} or {b2} better for {p}")},
    "zh-TW": {"search": ("我想找{p}", "想買{p}", "幫我找{p}", "有沒有{p}", "搜尋{p}", "{p}", "請給我看{p}", "找{p}",
                         "我要買{p}", "有賣{p}嗎", "哪裡買得到{p}", "想看看{p}"),
              "recommend": ("推薦{p}", "有什麼{p}推薦", "請推薦好用的{p}", "哪款{p}比較好", "幫我推薦{p}", "{p}推薦",
                            "求推薦{p}", "想買{p}，有推薦的嗎"),
              "compare": ("比較{b1}和{b2}的{p}", "{b1}跟{b2}的{p}哪個好", "{b1} vs {b2} {p}", "{b1}和{b2}的{p}差在哪",
                          "{p}：{b1}還是{b2}比較好", "幫我比較{b1}與{b2}{p}")},
}
BRAND_AFTER = {"en": ("{p} from {b}", "{p} by {b}"), "zh-TW": ()}

ORDER_STATUS = {
    "en": ("where is my order", "where's my order #{num}", "track order {num}", "has my order shipped yet",
           "my package still hasn't arrived", "order status for {num}", "when will order #{num} arrive",
           "check the status of my order", "is order {num} on the way", "tracking info for order #{num}"),
    "zh-TW": ("我的訂單到哪了", "查詢訂單{num}", "訂單{num}什麼時候會到", "包裹還沒收到", "我的貨出了沒",
              "幫我查一下訂單狀態", "訂單編號{num}的物流進度", "請問訂單#{num}出貨了嗎"),
}
RETURNS = {  # {p} is the product phrase; templates without it name no product
    "en": ("I want to return my {p}", "how do I return the {p} I bought", "return the {p} from order #{num}",
           "my {p} arrived broken, I want a refund", "refund for {p}", "start a return for order {num}",
           "i need to return an item", "can I send back the {p}", "the {p} doesn't fit, how do I return it"),
    "zh-TW": ("我要退貨", "我想退{p}", "{p}壞掉了，想申請退貨", "訂單{num}要退貨", "怎麼退{p}", "申請退款：{p}",
              "買的{p}尺寸不合，可以退嗎", "想把{p}退回去"),
}
OTHER = {
    "en": ("how do I change my password", "what are your customer service hours", "do you ship to {country}",
           "can I pay with {pay}", "hi there", "how do I use a coupon code", "can I change my delivery address",
           "how do I contact support", "is there a membership discount", "do you have a store in {country}"),
    "zh-TW": ("怎麼修改密碼", "客服電話幾號", "有寄到{country}嗎", "可以用{pay}付款嗎", "你好", "優惠券怎麼用",
              "可以改收件地址嗎", "會員有折扣嗎", "{country}有門市嗎"),
}
OTHER_FILL = {"en": {"country": ("Canada", "Japan", "Germany", "Australia", "Taiwan", "Mexico"),
                     "pay": ("PayPal", "Apple Pay", "a credit card", "cash on delivery", "bank transfer")},
              "zh-TW": {"country": ("日本", "香港", "美國", "新加坡", "馬來西亞", "離島"),
                        "pay": ("信用卡", "Line Pay", "街口支付", "貨到付款", "ATM轉帳")}}
