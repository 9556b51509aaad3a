"""What a realtime request is checked for before its body: the model, and the endpoint it
is sent to (docs/realtime.md, "Errors"). The body's own rules are its task kind's
(inference/kinds: EmbedKind.realtime_request, DecideKind.realtime_request).

An unknown model (or one outside the key's scopes) is 422, as everywhere in the API; an
embedding model sent for decisions (and the reverse) is 400, pointing at the right
endpoint; a catalog model that is not served in realtime (a chat model, or one this
deployment has no realtime engine for) is 501.
"""

from __future__ import annotations

from typing import TypeVar

from anex.errors import Invalid, NotServed
from console.models import ApiKey
from console.selectors import model_for_key
from inference.catalog import CatalogModel
from inference.kinds import AnyKind, kind_for, kinds_all
from realtime.constants import ENCODING_FORMATS
from realtime.selectors import realtime_engine_urls

KindT = TypeVar("KindT", bound=AnyKind)


def realtime_path(kind: AnyKind) -> str:
    """The realtime endpoint answering a kind's requests: its batch endpoint's twin."""
    return f"POST /realtime{kind.endpoint}"


def realtime_model_require(*, model_id: str, key: ApiKey, kind: type[KindT]
                           ) -> tuple[CatalogModel, KindT, tuple[str, ...]]:
    """The catalog model this key may use on the endpoint of `kind`, its kind, and its
    engines' URLs."""
    model = model_for_key(model_id, key)  # 422 for an unknown id or one out of scope
    its = kind_for(model)
    if not its.realtime:
        served = " and ".join(realtime_path(k) for k in kinds_all() if k.realtime)
        raise NotServed(f"model '{model.id}' is {its.noun}, not served in realtime: send its "
                        f"requests as a batch job. The realtime API answers {served}.")
    if not isinstance(its, kind):
        raise Invalid(f"model '{model.id}' is {its.noun}, which this endpoint does not "
                      f"serve: send it to {realtime_path(its)}.")
    urls = realtime_engine_urls(model)
    if not urls:
        where = ("it is batch-only" if model.price.realtime_input_per_mtok is None
                 else "this deployment has no realtime engine for it")
        raise NotServed(f"model '{model.id}' is not served in realtime ({where}): use "
                        "the batch API, or a model GET /realtime/v1/models lists with "
                        "\"realtime\": true.")
    return model, its, urls


def encoding_format_check(encoding_format: str | None) -> None:
    """The one wire option of an embeddings request that is not its rows' (400)."""
    if encoding_format is not None and encoding_format not in ENCODING_FORMATS:
        raise Invalid(f"encoding_format must be \"float\", not {encoding_format!r}: "
                      "vectors are returned as floats.")
