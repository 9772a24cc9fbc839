"""First-use measurement (``ATTNHUB_AUTOTUNE``): on CUDA, ``auto`` times the candidates of a
request class the device's profile lacks on fresh random inputs, records the class in the user's
profile and chooses again (docs/dispatch.md). The dispatcher itself never times anything: the
package root (attnhub/__init__.py) wires :func:`measure` into it (:data:`attnhub.dispatch.DISPATCHER`)."""

from __future__ import annotations

from attnhub import settings
from attnhub.dispatch import Explanation, explain_request
from attnhub.request import Request


def measure(req: Request, exp: Explanation) -> Explanation:
    """First-use measurement (``ATTNHUB_AUTOTUNE``; by default CUDA requests long enough to time):
    time the candidates of a class the profile lacks (or lacks the prior's first pick for), in
    the prior's order, on random inputs of the request's shapes (the caller's arrays are never
    touched), then choose again. A timing the tuner does not trust is not kept: the prior decides."""
    if len(exp.order) < 2:
        return exp
    from attnhub import tuner

    mode = settings.value("ATTNHUB_AUTOTUNE")
    if not tuner.worth_measuring(req, mode) or not tuner.can_measure(req):
        return exp
    if tuner.measure_request(req, tuner.candidates(req)) is None:
        return exp
    return explain_request(req, "auto")
