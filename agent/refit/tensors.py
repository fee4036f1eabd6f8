"""Torch-side helpers for refit plans: dtypes, a slot's views of a full state dict, the
receiving tensors a subscriber allocates, and Megatron roles from the modules a user marks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ...wire.refit import DTYPES, Layout, PlanError, ReshardPlan, Side


def dtype_of(name: str) -> torch.dtype:
    """The torch dtype a plan's dtype name stands for."""
    if name not in DTYPES:
        raise PlanError(f"unknown dtype {name!r}")
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    """The plan's name for a torch dtype (``torch.float32`` -> ``"float32"``)."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise PlanError(f"dtype {dtype} cannot be refit; known: {', '.join(sorted(DTYPES))}")
    return name


def tensors_of(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``name -> (dtype, shape)`` of a full state dict, as :func:`wire.refit.megatron_params`
    takes it."""
    return {n: (dtype_name(t.dtype), tuple(t.shape)) for n, t in state.items()}


def local_view(full: torch.Tensor, layout: Layout, name: str, slot: int) -> torch.Tensor | None:
    """The part of the full tensor ``name`` that ``slot`` of ``layout`` holds (a view), or None."""
    region = layout.local_region(layout.param(name), slot)
    if region is None:
        return None
    view = full
    for dim, (lo, hi) in enumerate(region):
        view = view.narrow(dim, lo, hi - lo)
    return view


def local_shards(
    state: Mapping[str, torch.Tensor], plan: ReshardPlan, side: Side, slot: int
) -> dict[str, torch.Tensor]:
    """This slot's contiguous copies of its parts of a full state dict (a publisher's shards,
    or what a subscriber should end up holding)."""
    layout = plan.layout(side)
    out = {}
    for p in layout.params:
        view = local_view(state[p.name], layout, p.name, slot)
        if view is not None:
            out[p.name] = view.contiguous().clone()
    return out


def empty_shards(
    plan: ReshardPlan, side: Side, slot: int, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Uninitialized tensors of the shapes this slot holds (what a subscriber receives into)."""
    layout = plan.layout(side)
    out = {}
    for p in layout.params:
        shape = layout.local_shape(p.name, slot)
        if shape is not None:
            out[p.name] = torch.empty(shape, dtype=dtype_of(p.dtype), device=device)
    return out


def roles_from_modules(
    model: nn.Module,
    *,
    column: Iterable[nn.Module] = (),
    row: Iterable[nn.Module] = (),
    rest: str | None = None,
) -> dict[str, str]:
    """Megatron roles for ``model``'s parameters from the ``nn.Linear``/``nn.Embedding``
    modules the user marks: a ``column`` module's weight and bias split along dim 0, a ``row``
    module's weight along dim 1 (its bias replicated). Parameters of unmarked modules get
    ``rest`` (e.g. ``"replicated"``); with ``rest=None`` they are refused, by name.
    """
    marks: dict[int, str] = {}
    for role, modules in (("column", column), ("row", row)):
        for m in modules:
            if not isinstance(m, (nn.Linear, nn.Embedding)):
                raise TypeError(f"only nn.Linear and nn.Embedding can be marked {role}, got {m!r}")
            if marks.setdefault(id(m), role) != role:
                raise PlanError(f"{m!r} is marked both column and row")
    roles: dict[str, str] = {}
    unmarked = []
    for mname, module in model.named_modules():
        for pname, _ in module.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            role = marks.get(id(module))
            if role == "column":
                roles[full] = "column"
            elif role == "row":
                roles[full] = "row" if pname == "weight" else "replicated"
            elif rest is not None:
                roles[full] = rest
            else:
                unmarked.append(full)
    if unmarked:
        raise PlanError(
            f"no role for {', '.join(sorted(unmarked))}: mark their modules or pass rest="
        )
    return roles
