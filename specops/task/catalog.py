"""Search the product catalog with one answer's parameters: what the shopper would be shown.

Every constraint of the contract becomes one condition of a single query, with bound parameters: keywords must
all match (FTS5 phrase queries over title and description), brands / colours / sizes are any-of (case-insensitive),
prices are compared in the answer's currency (USD when it names none), ``in_stock`` / ``free_shipping`` true or false
filter, null does not. Sorting follows ``sort`` with the product id as the last tie-break, so a result is a pure
function of the parameters. An answer that does not parse or does not satisfy the contract searches for nothing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from specops.errors import SpecopsError

USD_RATES = {"USD": 1.0, "TWD": 31.5, "EUR": 0.92, "JPY": 150.0, "CNY": 7.2, "GBP": 0.79}
ORDER = {"price_asc": "p.price_usd ASC", "price_desc": "p.price_usd DESC", "rating_desc": "p.rating DESC",
         "newest": "p.created DESC", "best_selling": "p.sales DESC"}


def open_catalog(path: str | Path) -> sqlite3.Connection:
    path = Path(path)
    if not path.is_file():
        raise SpecopsError(f"catalog not found: {path} (build it with `specops fixtures catalog`)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    return conn


def _phrase(text: str) -> str:
    """One FTS5 phrase for a keyword: its characters quoted, inner quotes doubled."""
    return '"' + text.replace('"', '""') + '"'


def search(conn: sqlite3.Connection, params: Any, k: int = 10) -> list[dict]:
    """The top ``k`` products for ``params`` (a parsed answer), or [] when the answer is not a valid one."""
    from specops.task.schema import is_valid

    if not isinstance(params, dict) or not is_valid(params):
        return []
    where, args = [], []
    keywords = [w.strip() for w in params["keywords"] if w.strip()]
    if keywords:
        where.append("p.id IN (SELECT rowid FROM products_fts WHERE products_fts MATCH ?)")
        args.append(" AND ".join(_phrase(w) for w in keywords))
        rank = "(SELECT bm25(products_fts) FROM products_fts WHERE products_fts MATCH ? AND rowid = p.id) ASC, "
    if params["category"]:
        where.append("p.category = ?")
        args.append(params["category"])
    for column, values in (("brand", params["brands"]), ("color", params["colors"]), ("size", params["sizes"])):
        if values:
            where.append(f"lower(p.{column}) IN ({', '.join('?' * len(values))})")
            args += [v.lower() for v in values]
    rate = USD_RATES[params["currency"] or "USD"]
    if params["price_min"] is not None:
        where.append("p.price_usd * ? >= ?")
        args += [rate, params["price_min"]]
    if params["price_max"] is not None:
        where.append("p.price_usd * ? <= ?")
        args += [rate, params["price_max"]]
    if params["rating_min"] is not None:
        where.append("p.rating >= ?")
        args.append(params["rating_min"])
    if params["in_stock"] is not None:
        where.append("p.stock > 0" if params["in_stock"] else "p.stock = 0")
    if params["free_shipping"] is not None:
        where.append("p.free_shipping = ?")
        args.append(int(params["free_shipping"]))
    if params["condition"]:
        where.append("p.condition = ?")
        args.append(params["condition"])
    if params["sort"] in ORDER:
        order = ORDER[params["sort"]] + ", "
    else:  # relevance: the FTS5 rank when there are keywords
        order = rank if keywords else ""
    sql = (f"SELECT p.id, p.title, p.brand, p.category, p.price_usd, p.color, p.size, p.rating, p.stock, "
           f"p.free_shipping, p.condition FROM products p {'WHERE ' + ' AND '.join(where) if where else ''} "
           f"ORDER BY {order}p.id LIMIT ?")
    rank_args = [" AND ".join(_phrase(w) for w in keywords)] if keywords and params["sort"] not in ORDER else []
    try:
        rows = conn.execute(sql, args + rank_args + [k]).fetchall()
    except sqlite3.OperationalError:  # a keyword FTS5 cannot parse (only punctuation, say) matches nothing
        return []
    return [dict(r) for r in rows]
