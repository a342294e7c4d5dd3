"""One retry policy for both SDKs: their exception trees are parallel, so one mapping serves both.

retried:   429, 5xx (and Anthropic's 529 "overloaded"), time-outs, dropped connections,
           malformed responses
run ends:  401/403 (reason `auth`), 404 (unknown model), other 4xx; a context overflow is its own
           error so the loop can drop old turns
"""

from __future__ import annotations

import json
from types import ModuleType

from labkube.agent.providers.provider import ContextOverflow, ProviderError
from labkube.agent.providers.transport_errors import answer_may_have_begun, is_transport_error
from labkube.budgets import StopReason, refused_budget

OVERFLOW_HINTS = ("context_length", "maximum context", "too long", "prompt is too long")


def one_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def map_sdk_error(exc: Exception, sdk: ModuleType) -> ProviderError:
    """`exc` from the `openai` or `anthropic` SDK as a ProviderError; anything else is re-raised."""
    text = one_line(exc)
    if isinstance(exc, sdk.APIStatusError) and (budget := refused_budget(str(exc))) is not None:
        # the pod's gateway refused the call: the run's budget is spent as the cluster counts it (never retried)
        return ProviderError(f"the model gateway refused the call: {text}", retryable=False, reason=budget)
    if isinstance(exc, sdk.AuthenticationError | sdk.PermissionDeniedError):
        return ProviderError(f"authentication failed: {text}", retryable=False, reason=StopReason.auth)
    if isinstance(exc, sdk.NotFoundError):
        return ProviderError(f"model not found: {text}", retryable=False)
    if isinstance(exc, sdk.BadRequestError):
        if any(hint in text for hint in OVERFLOW_HINTS):
            return ContextOverflow(text)
        return ProviderError(f"request rejected: {text}", retryable=False)
    if isinstance(exc, sdk.RateLimitError | sdk.InternalServerError):
        return ProviderError(f"{type(exc).__name__}: {text}", retryable=True)
    if isinstance(exc, sdk.APIConnectionError):  # its time-out too
        return ProviderError(f"{type(exc).__name__}: {text}", retryable=True, unsaid_usage=answer_may_have_begun(exc))
    if isinstance(exc, sdk.APIStatusError):
        retry = exc.status_code >= 500  # includes Anthropic's 529 (overloaded)
        return ProviderError(f"HTTP {exc.status_code}: {text}", retryable=retry)
    if isinstance(exc, sdk.APIError | json.JSONDecodeError):  # an answer came, and could not be read
        return ProviderError(f"malformed response: {text}", retryable=True, unsaid_usage=True)
    if is_transport_error(exc):  # a stream cut mid-way
        message = f"connection failed: {type(exc).__name__}: {text}"
        return ProviderError(message, retryable=True, unsaid_usage=answer_may_have_begun(exc))
    raise exc
