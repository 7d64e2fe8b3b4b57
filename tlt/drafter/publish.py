"""Which drafter the rollouts draft with: the hub's newest parameters, or the last ones validated.

The online trainer only sees recent rollouts. Where a step holds few prompts (GRPO: a handful of
prompts x a group of samples) the drafter can fit those prompts and draft worse for the next step's
(`tlt bench drafter` measures it: docs/results.md). So with
`drafter.publish: validated` a step's rollouts draft with the *served* drafter, and the hub's newer parameters (the
*candidate*) are scored beside it on the step's fresh rollouts,
which neither has trained on; the candidate is served from the next step on only if it agrees with
the policy at least as often. Training goes on from the candidate either way (the hub keeps its own
trajectory and AdamW state), so a drafter that first loses and then overtakes gets through. The price
is one step of lag and one extra drafter pass over each step's rollouts.
"""

from __future__ import annotations

from typing import Any, TypeVar

Drafter = TypeVar("Drafter", bound=tuple[int, Any])  # (version, parameters)


def step_drafters(publish: str, served: Drafter | None, newest: Drafter) -> tuple[Drafter, Drafter | None]:
    """(drafter the step drafts with, candidate to score beside it) from the hub's `newest`.

    latest, or nothing served yet: the newest drafts, no candidate. validated: the served one drafts,
    and the newest is the candidate when its version differs.
    """
    if publish not in ("validated", "latest"):
        raise ValueError(f"drafter.publish must be 'validated' or 'latest', got {publish!r}")
    if publish == "latest" or served is None:
        return newest, None
    return served, (newest if newest[0] != served[0] else None)


def promote(served: tuple[int, int], candidate: tuple[int, int]) -> bool:
    """Whether the candidate replaces the served drafter.

    served, candidate: (agreeing positions, positions scored), summed over the workers, on the same
    fresh positions. Ties promote (the candidate saw newer data); with nothing scored, nothing changes.
    """
    (agree_s, total_s), (agree_c, total_c) = served, candidate
    for name, (agree, total) in (("served", served), ("candidate", candidate)):
        if not 0 <= agree <= total:
            raise ValueError(f"{name}: agreeing positions must be in [0, {total}], got {agree}")
    if total_s == 0 or total_c == 0:
        return False
    return agree_c * total_s >= agree_s * total_c


def publish_outcome(
    served: Drafter | None, candidate: Drafter | None, results: list[dict[str, Any]]
) -> tuple[dict[str, Any], Drafter | None]:
    """The step's publish metrics and the drafter served from the next step on.

    served / candidate: the step's (`step_drafters`); results: the rollout workers' results, each with
    the served drafter's `agree` / `agree_total` positions and, when a candidate was scored beside it,
    `candidate_agree` / `candidate_total`. The candidate is served next if `promote` says so."""
    out: dict[str, Any] = {
        "drafter_served_version": served[0] if served is not None else None,
        "drafter_candidate_version": None,
        "drafter_candidate_agreement": None,
        "drafter_promoted": None,
    }
    if candidate is None:
        return out, served
    scored = (sum(r["agree"] for r in results), sum(r["agree_total"] for r in results))
    tried = (sum(r.get("candidate_agree", 0) for r in results), sum(r.get("candidate_total", 0) for r in results))
    promoted = promote(scored, tried)
    out.update(
        drafter_candidate_version=candidate[0],
        drafter_promoted=promoted,
        drafter_candidate_agreement=tried[0] / tried[1] if tried[1] else None,
    )
    return out, (candidate if promoted else served)
