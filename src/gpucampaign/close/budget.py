"""The budget close: rental, other expenses, money spent and rental per accepted delivery.

Money is computed in ``Decimal`` and rounded to cents only at the end; no hourly rate is ever
derived from a lot's price.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from gpucampaign.config import Package, SpecError
from gpucampaign.plan import tariffs

CENT = Decimal("0.01")


def _usd(x: Any) -> Decimal:
    """A money amount as Decimal; floats go through repr so 47.14 stays 47.14."""
    if isinstance(x, Decimal):
        return x
    if isinstance(x, float):
        return Decimal(repr(x))
    return Decimal(str(x))


def _cents(x: Decimal) -> float:
    """Rounded to cents, as a float whose repr is the cent value (JSON-ready)."""
    return float(x.quantize(CENT, rounding=ROUND_HALF_UP))


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    raise TypeError(f"expected a mapping or a pydantic model, got {type(obj).__name__}")


def resolve_packages(packages: Iterable[Any], *, catalog: Any = None) -> list[dict[str, Any]]:
    """Packages with their price per lot: the spec's ``price_usd``, else the provider catalog.

    Args:
        packages: spec ``Package`` objects (priced through ``gpucampaign.plan.tariffs``) or
            already resolved dicts ``{gpu, days, count, price_usd, gpus?}``.
        catalog: the ``tariffs.Catalog`` to price spec packages with (built-in by default).

    Returns:
        One dict per package ``{gpu, days, gpus, count, price_usd}`` (price as Decimal).

    Raises:
        SpecError: a package has no price anywhere.
    """
    out = []
    for i, p in enumerate(packages):
        if isinstance(p, Package):
            r = tariffs.resolve_package(p, catalog or tariffs.BUILTIN_CATALOG, index=i)
            out.append(
                {
                    "gpu": r.gpu,
                    "days": r.days,
                    "gpus": r.gpus_per_lot,
                    "count": r.count,
                    "price_usd": r.price_usd,
                    "order_ref": p.order_ref,
                }
            )
            continue
        d = _as_dict(p)
        if d.get("price_usd") is None:
            raise SpecError(
                f"field 'packages[{i}].price_usd': package {d.get('gpu')} {d.get('days')} days "
                "has no price; give the price of one lot for its whole duration",
                field=f"packages[{i}].price_usd",
            )
        out.append(
            {
                "gpu": d["gpu"],
                "days": int(d["days"]),
                "gpus": d.get("gpus"),
                "count": int(d.get("count", 1)),
                "price_usd": _usd(d["price_usd"]),
                "order_ref": d.get("order_ref"),
            }
        )
    return out


def _dedupe_deliveries(
    deliveries: Iterable[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Accepted, rejected and replayed deliveries; a replay (same content) counts once."""
    by_hash: dict[str, dict[str, Any]] = {}
    replays = []
    for d in deliveries:
        h = str(d["content_sha256"])
        if h in by_hash:
            first = by_hash[h]
            replays.append({"id": d["id"], "replay_of": first["id"], "content_sha256": h})
            if d.get("accepted") and not first["accepted"]:
                by_hash[h] = {**dict(d), "accepted": True}
            continue
        by_hash[h] = {**dict(d), "accepted": bool(d.get("accepted"))}
    accepted = [d for d in by_hash.values() if d["accepted"]]
    rejected = [
        {
            "id": d["id"],
            "content_sha256": d["content_sha256"],
            "reason": d.get("reason") or "no reason recorded",
        }
        for d in by_hash.values()
        if not d["accepted"]
    ]
    return accepted, rejected, replays


def close_budget(
    packages: Iterable[Any],
    *,
    catalog: Any = None,
    expenses: Iterable[Any] = (),
    deliveries: Iterable[Mapping[str, Any]] = (),
    unit: str | None,
    result_text: str | None = None,
) -> dict[str, Any]:
    """The budget close: rental, other expenses apart, spent, and rental per accepted delivery.

    Replays of a delivery (same ``content_sha256``) count once: accepted when any copy was.
    With zero accepted deliveries the ratio is undefined (None) and the reason names each
    rejection; the money spent is always shown. With no delivery unit (a research decision),
    no per-unit figure is made: ``result`` describes what was obtained instead.

    Args:
        packages: committed lots: spec ``Package`` objects or resolved dicts (see
            ``resolve_packages``).
        catalog: the ``tariffs.Catalog`` for spec packages without ``price_usd``.
        expenses: other expenses really incurred (``{name, usd, note}``), never invented.
        deliveries: ``{id, content_sha256, accepted, reason}`` per delivery candidate.
        unit: the delivery unit (e.g. "corpus"), None for a research decision.
        result_text: what the campaign obtained (the verdict text), used when ``unit`` is None.

    Returns:
        A JSON-ready dict; money values are floats rounded to cents.
    """
    lines = []
    rental = Decimal(0)
    for p in resolve_packages(packages, catalog=catalog):
        total = p["price_usd"] * p["count"]
        rental += total
        lines.append({**p, "price_usd": _cents(p["price_usd"]), "total_usd": _cents(total)})
    exp_lines, other = _expense_lines(expenses)
    spent = rental + other
    accepted, rejected, replays = _dedupe_deliveries(deliveries)

    per: Decimal | None = None
    reason: str | None = None
    if unit is None:
        reason = (
            "research decision: the spec names no delivery unit, so no per-unit rental is made "
            "up; the result obtained: " + (result_text or "see the verdict")
        )
    elif not accepted:
        why = "; ".join(f"{r['id']}: {r['reason']}" for r in rejected) or "no delivery was produced"
        reason = (
            f"zero accepted {unit} deliveries ({why}); {_cents(spent):.2f} USD spent all the same"
        )
    else:
        per = (rental / len(accepted)).quantize(CENT, rounding=ROUND_HALF_UP)

    return {
        "packages": lines,
        "expenses": exp_lines,
        "rental_usd": _cents(rental),
        "other_expenses_usd": _cents(other),
        "spent_usd": _cents(spent),
        "unit": unit,
        "accepted_deliveries": len(accepted),
        "accepted": [{"id": d["id"], "content_sha256": d["content_sha256"]} for d in accepted],
        "rejected": rejected,
        "replays": replays,
        "rental_per_accepted_usd": None if per is None else float(per),
        "undefined_reason": reason,
        "result": result_text if unit is None else None,
    }


def _expense_lines(expenses: Iterable[Any]) -> tuple[list[dict[str, Any]], Decimal]:
    """The other expenses as ``{name, usd, note}`` lines, and their sum."""
    lines, other = [], Decimal(0)
    for e in expenses:
        d = _as_dict(e)
        amount = _usd(d["usd"])
        other += amount
        lines.append({"name": d["name"], "usd": _cents(amount), "note": d.get("note", "")})
    return lines, other


def _budget_lines(budget: Mapping[str, Any]) -> list[str]:
    """The lots table, the other expenses and the money spent."""
    out = ["| Committed lot | Count | Price per lot (USD) | Total (USD) |", "|---|---:|---:|---:|"]
    for p in budget["packages"]:
        gpus = f", {p['gpus']} GPU(s) per lot" if p.get("gpus") else ""
        ref = f", order {p['order_ref']}" if p.get("order_ref") else ""
        out.append(
            f"| {p['gpu']} {p['days']} days{gpus}{ref} | {p['count']} | {p['price_usd']:.2f} | "
            f"{p['total_usd']:.2f} |"
        )
    out.append(f"| **Rental** | | | **{budget['rental_usd']:.2f}** |")
    out.append("")
    if budget["expenses"]:
        out += ["Other expenses really incurred (kept apart from the rental):", ""]
        out += [
            f"- {e['name']}: {e['usd']:.2f} USD" + (f" ({e['note']})" if e["note"] else "")
            for e in budget["expenses"]
        ]
    else:
        out.append(
            "Other expenses really incurred: none recorded (no tax or transfer cost is assumed)."
        )
    out += [
        "",
        f"**Spent: {budget['spent_usd']:.2f} USD** (rental {budget['rental_usd']:.2f} "
        f"+ other {budget['other_expenses_usd']:.2f}).",
        "",
    ]
    return out


def with_expenses(budget: Mapping[str, Any], expenses: Iterable[Any]) -> dict[str, Any]:
    """A closed budget with its other expenses replaced (the spec's and the ledger's).

    The rental, the deliveries and the rental per accepted delivery stay as closed; the other
    expenses and the money spent are recomputed. Nothing is added that was not recorded.
    """
    lines, other = _expense_lines(expenses)
    spent = _usd(budget["rental_usd"]) + other
    return {
        **budget,
        "expenses": lines,
        "other_expenses_usd": _cents(other),
        "spent_usd": _cents(spent),
    }


def render_budget_md(budget: Mapping[str, Any], *, result: str | None = None) -> str:
    """The budget close as a short markdown section; ``result`` names the result obtained in
    place of the budget's own words (the report, which states it once, above)."""
    out = _budget_lines(budget)
    unit = budget["unit"]
    if budget["rental_per_accepted_usd"] is not None:
        out.append(
            f"Accepted deliveries ({unit}): {budget['accepted_deliveries']}; rental per accepted "
            f"{unit}: **{budget['rental_per_accepted_usd']:.2f} USD**."
        )
    elif unit is None:
        out.append(
            "No delivery unit (a research decision): no rental per unit is made up. "
            f"Result obtained for {budget['spent_usd']:.2f} USD: "
            f"{result or budget.get('result') or 'see the verdict'}"
        )
    else:
        out.append(f"Accepted deliveries ({unit}): {budget['accepted_deliveries']}.")
        out.append(f"Rental per accepted {unit}: undefined — {budget['undefined_reason']}")
    if budget["rejected"]:
        out += ["", "Rejected deliveries:"] + [
            f"- {r['id']}: {r['reason']}" for r in budget["rejected"]
        ]
    if budget["replays"]:
        out += [
            "",
            "Replays of an earlier delivery (same content, counted once): "
            f"{len(budget['replays'])}.",
        ]
    return "\n".join(out) + "\n"
