"""What to do about the acceptance measured, derived from the numbers (never from the draft's name)."""

from __future__ import annotations

VALUES = ("string", "number", "literal")


def advise(drafts: dict[str, dict]) -> list[str]:
    out = []
    for name, d in drafts.items():
        shares = d.get("rejection_share_by_class") or {}
        schema = d.get("schema_rejection_share")
        values = sum(shares.get(c, 0.0) for c in VALUES)
        if schema is not None and schema >= 0.5:
            out.append(f"{name}: {schema:.0%} of rejections fall on schema tokens (punctuation, quotes, keys): "
                       "the grammar fixes most of them, so schema-aware drafting (proposing forced tokens) would "
                       "remove them")
        elif shares and values >= 0.5:
            out.append(f"{name}: {values:.0%} of rejections fall on values (strings, numbers, literals): fine-tune "
                       "the draft on the target's own answers to domain prompts (specops train-draft)")
        pos = d.get("per_position") or []
        if pos and pos[0] < 0.5:
            out.append(f"{name}: its first proposal is kept in only {pos[0]:.0%} of rounds: it has not learnt this "
                       "target's distribution; γ = 1 or no speculation until it is fine-tuned")
        for p in range(1, len(pos)):
            if pos[p] < 0.3 <= pos[p - 1]:
                out.append(f"{name}: position {p + 1} is kept in {pos[p]:.0%} of rounds: γ above {p} adds little")
                break
    if len(drafts) >= 2:
        best = max(drafts, key=lambda n: drafts[n]["mean_acceptance_length"])
        worst = min(drafts, key=lambda n: drafts[n]["mean_acceptance_length"])
        if best != worst:
            ratio = drafts[best]["mean_acceptance_length"] / drafts[worst]["mean_acceptance_length"]
            out.append(f"{best} yields {ratio:.2f}× the mean acceptance length of {worst} on these prompts")
    return out
