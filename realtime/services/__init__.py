"""Every write and every realtime request's path (docs/dev/style.md rule 1), in three modules, one
per stage a request passes through:

- admission: whether it may be answered at all, before any engine reads it: the operator's
  switch, the residency rules, this process's places, the credits and the key's budget,
  and the reservation of its counted cost (realtime.concurrency);
- requests: the two requests (embeddings, decisions), checked by their task kind, counted,
  admitted, forwarded to an engine and billed what it read;
- settlement: the meter that records each answered request, and the settlement that
  charges metered usage to the ledger.

A request is judged, then counted, then admitted, then forwarded, then billed, in that
order (docs/realtime.md, "Errors"): the key's rate (429, the API's throttle, before the body
is parsed), the switch (503), the model and the endpoint (422, 400, 501), the region (403,
421), the body and its limits by the model's task kind, its inputs counted with the model's
tokenizer (422, 400, an input over the context among them), the credits and the key's
budget (402, or 503 when they cannot be read), this process's realtime places (503), the
reservation of its cost and the organization's concurrency (402, 503, 429: one Redis
call); then the engine (503 when it is at capacity, 502 when it fails to answer, 400 or
422 when the model refuses). An answered request is billed what it read; one the engine
took and did not answer in time is billed its counted tokens (the engine did the work).
"""
