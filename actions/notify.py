"""`notify`: POST a JSON message about the signal to an HTTP endpoint (chat webhook, pager bridge).

Delivery: at-least-once, with an idempotency key. A sent message cannot be observed afterwards, so
`verify` answers NOOP and a decision resumed after a crash between the POST and its journal record
sends the message again. Every POST of one step carries the same `Idempotency-Key: <effect key>`
(`"<decision id>/<step index>"`, unique within one journal): a receiver that keeps the keys it
has seen delivers the message once.
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping

import aiohttp
from pydantic import Field

from actions.base import IDEMPOTENCY_HEADER, ActionDeps, ActionParams, Step
from core.outcome import Outcome
from core.signal import Signal
from core.target import Target

KIND = "notify"


class NotifyParams(ActionParams):
    url: str = Field(pattern=r"^https?://")
    message: str = "tailguard: {signal} on {target}"
    timeout_seconds: float = Field(5.0, gt=0, alias="timeoutSeconds")


class Notify:
    kind: ClassVar[str] = KIND
    Params: ClassVar[type[ActionParams]] = NotifyParams
    advisory: ClassVar[bool] = True  # a notification never stops a remediation

    def __init__(self, deps: ActionDeps) -> None:
        self._deps = deps

    async def observe(self, target: Target, params: NotifyParams) -> Mapping[str, Any]:
        return {}

    def plan(self, target: Target, params: NotifyParams, observed: Mapping[str, Any],
             signal: Signal) -> Step:
        text = params.message.format(signal=signal.name, target=target.key, value=signal.value)
        return Step(KIND, target.key, f"notify {params.url}",
                    after={"url": params.url, "body": {"text": text, "signal": signal.summary()}})

    async def apply(self, step: Step, target: Target, params: NotifyParams) -> Outcome:
        session = self._deps.http
        owned = session is None
        session = session or aiohttp.ClientSession()
        try:
            headers = {} if step.effect_key is None else {IDEMPOTENCY_HEADER: step.effect_key}
            async with session.post(step.after["url"], json=step.after["body"], headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=params.timeout_seconds)) as resp:
                if resp.status >= 300:
                    return Outcome.failure(f"notify endpoint answered {resp.status}",
                                           retryable=resp.status >= 500)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Outcome.failure(f"notify failed: {type(exc).__name__}: {exc}", retryable=True)
        finally:
            if owned:
                await session.close()
        return Outcome.success("notified")

    async def verify(self, step: Step, target: Target, params: NotifyParams) -> Outcome:
        # NOOP, not OK: nothing shows the message arrived, so a resumed decision sends it again.
        return Outcome.noop("a sent message cannot be observed")

    async def revert(self, step: Step, target: Target, params: NotifyParams) -> Outcome:
        return Outcome.noop("a sent message cannot be unsent")
