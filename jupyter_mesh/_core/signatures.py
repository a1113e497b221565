"""Arguments checked against an endpoint's signature in the caller, before anything is sent.

A call with wrong arguments must fail where it was written, as Monarch's does (``TypeError``): sent, it
failed on every rank instead, and under ``broadcast()``, where no caller hears the error, it killed every
actor of the mesh. An actor mesh carries the parameter lists of its class's endpoints (names, kinds,
which have a default; the signature as text for messages), so a mesh passed to another actor checks
there too.

The check is on the hot path of every call: each endpoint's parameter list becomes a function with the
same parameters and an empty body, made once, so checking is one Python call (well under a µs), and
the binding is Python's own. Where the caller cannot know what the endpoint accepts, nothing is
checked: a method whose parameters no signature gives, or a mesh reattached from an earlier session
(its class is not here). A decorated method (``functools.wraps``) is checked against the wrapper's
own parameters, which is what receives the call (``*args, **kwargs``: anything).
"""

from __future__ import annotations

import inspect
import keyword
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .actor import Endpoint

__all__ = ["Signatures"]

Spec = tuple[str, tuple[tuple[str, int, bool], ...]]
"""(the signature as text, for messages; (name, ``inspect.Parameter`` kind, has a default) per parameter)."""

_TEXT_MAX = 300
_UNSEEN: Any = object()


class _Text(str):
    """An annotation kept as a string (``from __future__ import annotations``), shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _spec(ep: Endpoint[..., Any]) -> Spec | None:
    """The parameters a caller passes to ``ep`` (after ``self``, and after the reply port of an
    ``explicit_response_port`` endpoint, which the runtime passes): None where they cannot be known."""
    try:
        sig = inspect.signature(ep.fn, follow_wrapped=False)  # the wrapper is what the call reaches
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    for _ in range(2 if ep.explicit_port else 1):  # self, then the port: passed by the runtime
        if not params:
            return None  # takes fewer than the runtime passes: every call fails there, and says why
        if params[0].kind == params[0].VAR_POSITIONAL:
            break  # ``*args`` takes them, and whatever the caller passes after them
        if params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            return None
        params.pop(0)
    if any(not p.name.isidentifier() or keyword.iskeyword(p.name) for p in params):
        return None
    shown = [p.replace(annotation=_Text(p.annotation)) if isinstance(p.annotation, str) else p for p in params]
    text = str(sig.replace(parameters=shown, return_annotation=sig.empty))
    if len(text) > _TEXT_MAX:
        text = text[: _TEXT_MAX - 4] + " …)"
    return text, tuple((p.name, int(p.kind), p.default is not p.empty) for p in params)


def _well_formed(spec: Any) -> bool:
    """Whether ``spec`` is what ``_spec`` makes, exact types only (a str subclass could lie about being an
    identifier): a spec comes unpickled with a mesh, maybe from another version, or forged."""
    if not (type(spec) is tuple and len(spec) == 2 and type(spec[0]) is str and type(spec[1]) is tuple):
        return False
    return all(
        type(p) is tuple
        and len(p) == 3
        and type(p[0]) is str
        and p[0].isidentifier()
        and not keyword.iskeyword(p[0])
        and type(p[1]) is int
        and 0 <= p[1] <= 4
        and type(p[2]) is bool
        for p in spec[1]
    )


def _checker(spec: Spec) -> Callable[..., None]:
    """A function taking exactly the parameters of ``spec``, doing nothing: calling it binds the
    arguments as the endpoint will (Python's own rules), at the cost of one call."""
    P = inspect.Parameter
    out: list[str] = []
    if not _well_formed(spec):
        raise ValueError(f"not a parameter list: {spec!r:.200}")  # (a spec unpickled from elsewhere)
    kinds = [k for _, k, _ in spec[1]]
    for name, kind, has_default in spec[1]:
        if kind == P.KEYWORD_ONLY and P.VAR_POSITIONAL not in kinds and "*" not in out:
            out.append("*")  # keyword-only parameters follow a bare star
        prefix = "*" if kind == P.VAR_POSITIONAL else "**" if kind == P.VAR_KEYWORD else ""
        out.append(prefix + name + ("=None" if has_default else ""))
    n_posonly = kinds.count(P.POSITIONAL_ONLY)  # they come first: a slash closes them
    if n_posonly:
        out.insert(n_posonly, "/")
    namespace: dict[str, Any] = {}
    exec(f"def check({', '.join(out)}):\n    pass\n", namespace)  # (identifiers only: checked above)
    return namespace["check"]  # type: ignore[no-any-return]


def _signature(spec: Spec) -> inspect.Signature:
    P = inspect.Parameter
    kinds = {
        int(k): k for k in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.VAR_POSITIONAL, P.KEYWORD_ONLY, P.VAR_KEYWORD)
    }
    return inspect.Signature([P(n, kinds[k], default=None if d else P.empty) for n, k, d in spec[1]])


class Signatures:
    """The endpoints' parameter lists of one actor class; shared by an actor mesh and its views, and
    pickled with them as their specs only (checkers are made again where they are used)."""

    def __init__(self, class_name: str, specs: Mapping[str, Spec | None]):
        self.class_name, self.specs = class_name, dict(specs)
        self._checkers: dict[str, Callable[..., None] | None] = {}

    @classmethod
    def of(cls, actor_class: type, endpoints: Mapping[str, Endpoint[..., Any]]) -> Signatures:
        return cls(actor_class.__qualname__, {name: _spec(ep) for name, ep in endpoints.items()})

    def __reduce__(self) -> tuple[Any, ...]:
        return (Signatures, (self.class_name, self.specs))

    def replace_with(self, new: Signatures) -> None:
        """Take ``new``'s parameter lists in place (``%mesh reload``): every view of the mesh shares this
        object, also those the reload does not know of (a slice made before it), so none checks against
        the old definition."""
        self.class_name, self.specs, self._checkers = new.class_name, dict(new.specs), {}

    def checker(self, endpoint: str) -> Callable[..., None] | None:
        """What checks a call's arguments for ``endpoint`` (raising ``TypeError``), or None: unknown."""
        check = self._checkers.get(endpoint, _UNSEEN)
        if check is not _UNSEEN:
            return check  # type: ignore[return-value]
        spec = self.specs.get(endpoint)
        check = None
        if spec is not None:
            try:
                check = _checker(spec)
            except (SyntaxError, ValueError):  # a parameter list no ``def`` writes: the endpoint decides
                check = None
        self._checkers[endpoint] = check
        return check

    def refusal(self, endpoint: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> TypeError:
        """The ``TypeError`` for arguments that ``endpoint`` does not take: which, and its signature."""
        spec = self.specs[endpoint]
        assert spec is not None
        try:
            _signature(spec).bind(*args, **kwargs)
            why = "the arguments do not fit its parameters"
        except TypeError as e:
            why = str(e)  # Python's words, as Monarch's: "missing a required argument: 'x'"
        return TypeError(
            f"{self.class_name}.{endpoint}{spec[0]}: {why} (checked here: nothing was sent to the actors); "
            f"call it with the arguments it takes"
        )
