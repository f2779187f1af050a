"""The builder: plan + config -> an nn.Module with the reference's names and signature.

``not_supported_reasons(plan, config, device)`` says, before any work, why a plan cannot
run on a case and device (xformers style): its backends' reasons (``autotune.backends``,
the registry every attention, LayerNorm, FFN and fused-layer choice lives in), then the
execution knobs'. ``build_candidate`` returns a
``CandidateTransformer``: a subclass of the reference (so the state dict is the same)
whose forward follows the plan. Derived weights (packed QKV, fp16 copies) are made once
per weight version, never per call. Inputs the plan has no fast path for (a general
mask, a shape its CUDA graph was not captured for) take a slower path that is still
right: a candidate is a drop-in for the reference on every input.
"""

from __future__ import annotations

import operator
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)
from torch.optim.optimizer import register_optimizer_step_post_hook

from autotune import backends
from autotune.backends import MASK_GENERAL, MASK_NONE, MASK_RIGHT_PADDED, AttentionCall
from autotune.backends.precision import DTYPES, half_qkv, linear
from autotune.core.device import DeviceInfo
from autotune.core.reference import (
    ReferenceTransformer,
    TransformerConfig,
    settings_key,
)
from autotune.core.threads import FreshOnCopy
from autotune.plan import Plan

__all__ = [
    "MASK_GENERAL",
    "MASK_NONE",
    "MASK_RIGHT_PADDED",
    "CandidateTransformer",
    "UnsupportedPlan",
    "build_candidate",
    "classify_mask",
    "not_supported_reasons",
]


# torch.compile modes that capture CUDA graphs of their own (cudagraph trees).
GRAPHED_COMPILE_MODES = ("reduce-overhead", "max-autotune")


class UnsupportedPlan(ValueError):
    """Raised when a plan cannot be built for a case/device; carries every reason."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def not_supported_reasons(
    plan: Plan, config: TransformerConfig, device: DeviceInfo, *, prune: bool = False
) -> list[str]:
    """Every reason the plan cannot run on this case and device (empty: supported): its
    backends' (``autotune.backends``), then how the forward is executed.

    ``prune`` adds reasons a search should skip a plan that would run but waste its
    time (Triton tiles larger than the padded sequence)."""
    return backends.not_supported_reasons(plan, config, device, prune=prune) + execution_reasons(
        plan, device
    )


def execution_reasons(plan: Plan, device: DeviceInfo) -> list[str]:
    """The rules of the execution knobs: host I/O, CUDA graphs, torch.compile."""
    reasons: list[str] = []
    cuda = device.type == "cuda"
    if plan.host_io:
        if not cuda:
            reasons.append("host_io=true needs CUDA (on the CPU the input is already host memory)")
        if plan.cuda_graph:
            reasons.append("host_io=true streams chunks through the device; set cuda_graph false")
    if plan.batch_streams > 1:
        streams = f"batch_streams={plan.batch_streams}"
        if not cuda:
            reasons.append(f"{streams} needs CUDA streams; set batch_streams 1")
        if plan.batch_chunk <= 0:
            reasons.append(f"{streams} spreads batch chunks over streams; set batch_chunk > 0")
        if plan.cuda_graph or plan.host_io or plan.compile != "none":
            reasons.append(
                f"{streams} runs the eager chunked forward; set cuda_graph false, host_io "
                "false and compile none"
            )
    if plan.cuda_graph and not cuda:
        reasons.append("cuda_graph=true needs CUDA")
    if plan.compile in GRAPHED_COMPILE_MODES:
        if not cuda:
            reasons.append(f"compile={plan.compile} needs CUDA (it captures CUDA graphs)")
        if plan.cuda_graph:
            reasons.append(
                f"compile={plan.compile} already captures CUDA graphs; set cuda_graph false"
            )
    if plan.compile != "none" and plan.uses_triton:
        reasons.append(
            "compile with the project's Triton kernels is not supported; set compile none"
        )
    return reasons


def classify_mask(mask: Tensor | None) -> str:
    """What the mask is, checked on its values (one host sync)."""
    if mask is None:
        return MASK_NONE
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise ValueError(
            f"valid_token_mask must be a bool tensor [B, S], got {mask.dtype} {tuple(mask.shape)}"
        )
    all_valid = mask.all()
    prefix = (mask[:, 1:] <= mask[:, :-1]).all() & mask[:, 0].all()
    flags = torch.stack([all_valid, prefix]).tolist()
    if flags[0]:
        return MASK_NONE
    if flags[1]:
        return MASK_RIGHT_PADDED
    return MASK_GENERAL


class _LayerWeights:
    """The tensors one layer's forward reads. Plain parameters are referenced, not copied;
    derived tensors (packed QKV, fp16/bf16 copies) are made here, once per weight version."""

    __slots__ = (
        "copied",
        "ffn_in_b",
        "ffn_in_w",
        "ffn_out_b",
        "ffn_out_w",
        "k",
        "n1",
        "n2",
        "out_b",
        "out_w",
        "q",
        "qkv_b",
        "qkv_w",
        "v",
    )

    def __init__(self, layer: Any, plan: Plan) -> None:
        att = layer.attention
        gdt = DTYPES.get(plan.gemm_precision)

        # The parameters copied here (packed or cast): an in-place edit of one of them
        # leaves a stale copy; the others are read where they are.
        self.copied: list[Tensor] = []

        def cast(t: Tensor) -> Tensor:
            if gdt is None:
                return t
            self.copied.append(t)
            return t.detach().to(gdt)

        self.n1 = (layer.norm1.weight, layer.norm1.bias)
        self.n2 = (layer.norm2.weight, layer.norm2.bias)
        if plan.qkv == "packed":
            parts_w = [att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]
            parts_b = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
            self.copied += parts_w + parts_b
            self.qkv_w = torch.cat([p.detach() for p in parts_w], 0)
            self.qkv_b = torch.cat([p.detach() for p in parts_b], 0)
            if gdt is not None:
                self.qkv_w, self.qkv_b = self.qkv_w.to(gdt), self.qkv_b.to(gdt)
        else:
            self.q = (cast(att.q_proj.weight), cast(att.q_proj.bias))
            self.k = (cast(att.k_proj.weight), cast(att.k_proj.bias))
            self.v = (cast(att.v_proj.weight), cast(att.v_proj.bias))
        self.out_w, self.out_b = cast(att.out_proj.weight), cast(att.out_proj.bias)
        self.ffn_in_w, self.ffn_in_b = cast(layer.ffn_in.weight), cast(layer.ffn_in.bias)
        self.ffn_out_w, self.ffn_out_b = cast(layer.ffn_out.weight), cast(layer.ffn_out.bias)


# A tensor's in-place edit counter (bumped by optimizer steps, copy_ under no_grad, edits in
# inference mode; not by edits through ``.data``). Inference tensors keep none.
_VERSION = operator.attrgetter("_version")


# Candidates with derived weights made: an optimizer step over a parameter one copies
# makes its copies stale. Per module, what reads it (candidates' derived weights,
# dispatched models' plans): a parameter or submodule replaced in it makes those stale.
# The lock orders additions against the hooks' snapshots (a WeakSet may not grow while
# another thread iterates it).
_LOCK = threading.Lock()
_PREPARED: weakref.WeakSet[CandidateTransformer] = weakref.WeakSet()
_READERS: weakref.WeakKeyDictionary[torch.nn.Module, weakref.WeakSet[Any]] = (
    weakref.WeakKeyDictionary()
)


def watch_registrations(reader: Any, modules: Iterable[torch.nn.Module]) -> None:
    """``reader.registration_changed()`` runs when a parameter or submodule is registered
    on one of ``modules`` (``layer.weight = nn.Parameter(...)``, ``model.layers[0] =
    layer``, ``add_module``): the reader is dropped with its last reference."""
    with _LOCK:
        for module in modules:
            readers = _READERS.get(module)
            if readers is None:
                readers = _READERS[module] = weakref.WeakSet()
            readers.add(reader)


def _after_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """A global ``torch.optim`` step post-hook: candidates that copy a parameter the step
    updated remake their derived weights on their next call."""
    if not _PREPARED:
        return
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    with _LOCK:
        prepared = list(_PREPARED)
    for cand in prepared:
        if not cand._copied_ids.isdisjoint(stepped):
            cand.refresh()


def _after_registration(module: torch.nn.Module, name: str, value: Any) -> None:
    """A global ``nn.Module`` parameter and submodule registration hook: the readers of
    ``module`` hear of it. Only module construction and replacements run it (one
    dictionary look-up each): no cost a call."""
    if not _READERS:
        return None
    with _LOCK:
        readers = _READERS.get(module)
        readers = list(readers) if readers else []
    for reader in readers:
        reader.registration_changed()
    return None


register_optimizer_step_post_hook(_after_optimizer_step)
register_module_parameter_registration_hook(_after_registration)
register_module_module_registration_hook(_after_registration)


def _set(module: torch.nn.Module, name: str, value: Any) -> None:
    """A plain attribute (no tensor, no module) set without nn.Module's registry checks:
    the per-call bookkeeping costs a few microseconds each through ``__setattr__``."""
    object.__setattr__(module, name, value)


def refresh_after_load(module: Any, incompatible_keys: Any) -> None:
    """A ``load_state_dict`` post-hook (a module-level function: a module holding it can be
    pickled, as the reference can): the new weights' derived tensors are remade."""
    module.refresh()


class CandidateTransformer(FreshOnCopy, ReferenceTransformer):
    """The reference's parameters with a forward that follows a plan.

    Derived weights (packed QKV, fp16 copies, fused-layer copies) and captured graphs are
    made once per parameter version: ``load_state_dict``, ``.to()``/``.cuda()`` and a
    ``torch.optim`` step over a parameter a derived tensor copies bump it (a global
    optimizer hook: no cost a call); other in-place edits call ``refresh()``. With
    ``watch_edits`` on, each call also sums the copied parameters' autograd version
    counters, so that any in-place edit is seen (``copy_`` under ``no_grad`` included; not
    edits through ``.data`` or of inference tensors): 3-8 us of host time a call on an
    H100's host for 48 parameters (scripts/watch_edits_ab.py), so it is off by default.
    The parameters read where they are need neither. A parameter or submodule replaced in
    one of its modules (``norm.weight = nn.Parameter(...)``) is seen too (global
    registration hooks: no cost a call).

    Captured graphs replay on buffers this object owns: a lock makes a call's staging,
    replay and output hand-off one step, so threads sharing a module take turns there (on
    one CUDA stream: the lock orders what the host enqueues), and derived weights are
    remade by one thread. The guard's decisions (``guard_log``) are each thread's own.
    """

    # The graph path's lock (staging inputs, capturing and replaying: one step a call; and
    # remaking derived weights); per thread, the last forward's guard decisions; and no
    # derived weights (a copy remakes its own, and watches its own parameters).
    FRESH = (
        ("_graph_lock", threading.Lock),
        ("_per_thread", threading.local),
        ("_weights", lambda: None),
        ("_copied_ids", frozenset),
        # and no captured graphs, streams or fused-block copies (a copy captures its own)
        ("_graphs", dict),
        ("_streams", lambda: None),
        ("_block", lambda: None),
    )

    def __init__(self, config: TransformerConfig, plan: Plan, device: DeviceInfo) -> None:
        super().__init__(config)
        self._make_fresh()
        reasons = not_supported_reasons(plan, config, device)
        if reasons:
            raise UnsupportedPlan(reasons)
        self.plan = plan
        self.device_info = device
        self._weights: list[_LayerWeights] | None = None
        self._param_version = 0  # bumped by load_state_dict, .to() and refresh()
        self._weights_version = -1  # the parameter version _weights were made at
        # The copied parameters with version counters, and their versions' sum when
        # _weights were made (watch_edits False: none watched).
        self._watched: list[Tensor] = []
        self._watched_sum = 0
        self._copied_ids: frozenset[int] = frozenset()  # of every copied parameter
        self._graphs: dict[tuple[Any, ...], _CapturedForward] = {}
        self._streams: list[torch.cuda.Stream] | None = None  # batch_streams > 1
        self._block: Any = None  # fused-block weights (views of the parameters)
        self.last_route: str = ""
        self._attention_backend = backends.attention(plan.attention)
        self._norm_backend = backends.get("layernorm", plan.layernorm)
        self._ffn_backend = backends.get("ffn_act", plan.ffn_act)
        self._layer_backend = backends.layer_backend(plan)
        # Fused layers apply any mask themselves; the per-layer path asks its attention.
        self._classify = not self._layer_backend.fused and (
            self._attention_backend.needs_mask_kind(plan)
        )
        self.register_load_state_dict_post_hook(refresh_after_load)
        self._make_core()

    def _make_core(self) -> None:
        """The forward's core: compiled per the plan (made again by a copy: a compiled
        function is neither copied nor pickled)."""
        self._core: Callable[..., Tensor] = self._forward_core
        if self.plan.compile != "none":
            _raise_dynamo_limits()
            compiled = torch.compile(self._forward_core, mode=self.plan.compile, dynamic=False)
            self._core = compiled
            if self.plan.compile in GRAPHED_COMPILE_MODES:
                # Inductor's CUDA graphs hand out outputs that their next replay
                # overwrites: the caller gets its own copy.
                self._core = lambda *args: self._owned(compiled(*args))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_core", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._make_core()

    # Captured forwards kept per module (one per shape, mask kind and settings): a plan
    # serving a bucket sees many shapes; past this many, the least recently used capture
    # is dropped (its memory pool with it) and captured again if its shape returns.
    MAX_GRAPH_SHAPES = 16

    _watch_edits = False

    @property
    def watch_edits(self) -> bool:
        """True: every call reads the copied parameters' version counters (any in-place
        edit seen); False: only optimizer steps, load_state_dict, .to(), replacements and
        refresh() are. Set at any time: the next call remakes the weights, watched or not."""
        return self._watch_edits

    @watch_edits.setter
    def watch_edits(self, on: bool) -> None:
        if bool(on) != self._watch_edits:
            object.__setattr__(self, "_watch_edits", bool(on))
            self.refresh()

    # False: outputs of a compile mode that captures graphs are handed out as Inductor
    # returns them (overwritten by the next call), as ``torch.compile(model)`` does.
    owns_output = True

    def _owned(self, out: Tensor) -> Tensor:
        return out.clone() if self.owns_output else out

    # --- weights --------------------------------------------------------------------
    def refresh(self) -> None:
        """The parameters changed (in place): derived weights and graphs are remade."""
        self._param_version += 1

    registration_changed = refresh  # a parameter or submodule of ours replaced

    @property
    def guard_log(self) -> list[Any]:
        """Polynomial attention: the guard's decision for every layer (and batch chunk) of
        this thread's last forward, in order: what ran, and why."""
        log = getattr(self._per_thread, "guard_log", None)
        if log is None:
            log = self._per_thread.guard_log = []
        return log

    def _stale(self) -> bool:
        if self._weights is None or self._weights_version != self._param_version:
            return True
        if not self._watched:  # watch_edits off (the default): two comparisons a call
            return False
        try:  # counters only grow: their sum moves if any one does
            return sum(map(_VERSION, self._watched)) != self._watched_sum
        except RuntimeError:  # a watched tensor is now an inference tensor (a copy made
            return True  # in inference mode): remade, and watched no more

    def _copied_parameters(self, weights: list[_LayerWeights]) -> list[Tensor]:
        """The parameters a derived tensor copies (an in-place edit of one leaves a stale
        copy); the others are read where they are, by eager calls and graphs alike."""
        copied = [t for w in weights for t in w.copied]
        if self._layer_backend.fused:  # the fused layers' packed, cast weights
            for layer in self.layers:
                att = layer.attention
                for m in (att.q_proj, att.k_proj, att.v_proj, att.out_proj, layer.ffn_in,
                          layer.ffn_out):  # fmt: skip
                    copied += (m.weight, m.bias)
        params = list(self.parameters())
        if any(p.dtype != torch.float32 or not p.is_contiguous() for p in params):
            copied = params  # any layer backend may copy them: all watched
        # Inference tensors (made or moved inside inference mode) keep no counter: edits of
        # them (possible only inside inference mode) need refresh().
        unique = {id(t): t for t in copied}.values()
        return [t for t in unique if not t.is_inference()]

    def prepared_weights(self) -> list[_LayerWeights]:
        if self._stale():
            with self._graph_lock:  # one thread remakes them; no replay meanwhile
                if self._stale():
                    # The counters as the copies are made (an edit from here on: remade)
                    before = {id(p): p._version for p in self.parameters() if not p.is_inference()}
                    # A fused layer family reads its own packed copies (self._block), none
                    # of these: making them would only hold a second copy of the weights.
                    weights = []
                    if not self._layer_backend.fused:
                        with torch.no_grad():
                            weights = [_LayerWeights(layer, self.plan) for layer in self.layers]
                    copied = self._copied_parameters(weights)
                    watched = copied if self.watch_edits else []
                    total = sum(before.get(id(t), -1) for t in watched)
                    self._copied_ids = frozenset(map(id, copied))
                    # optimizer steps over these parameters, and replacements in these
                    # modules, refresh it
                    with _LOCK:
                        _PREPARED.add(self)
                    watch_registrations(self, self.modules())
                    self._block = None
                    self._graphs.clear()  # graphs read derived weights of their version
                    # The weights first: a thread that sees the new sum reads them after.
                    self._weights = weights
                    self._watched, self._watched_sum = watched, total
                    self._weights_version = self._param_version
        assert self._weights is not None
        return self._weights

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # .to()/.cuda()/.half() replace parameter storage: derived weights must be remade.
        self._weights = None
        self._block = None
        self._graphs.clear()
        self.refresh()
        return super()._apply(fn, recurse)

    # --- forward --------------------------------------------------------------------
    def forward(self, x: Tensor, valid_token_mask: Tensor | None = None) -> Tensor:
        c = self.config
        if x.dim() != 3 or x.shape[-1] != c.d_model:
            raise ValueError(f"x must be [B, S, {c.d_model}], got {tuple(x.shape)}")
        if valid_token_mask is not None and valid_token_mask.shape != x.shape[:2]:
            raise ValueError(
                f"valid_token_mask must be {tuple(x.shape[:2])}, got "
                f"{tuple(valid_token_mask.shape)}"
            )
        if self._classify:
            # Dropping a mask proven a no-op (SDPA and reference attention with
            # mask=elide) needs the mask's kind: one host sync. The Triton attention and
            # the fused block apply any mask on the device and need none.
            kind = classify_mask(valid_token_mask)
        else:
            kind = MASK_NONE if valid_token_mask is None else MASK_GENERAL
        weights = self.prepared_weights()
        if self.guard_log:  # only polynomial attention writes it
            self._per_thread.guard_log = []
        home = self.final_norm.weight.device
        if home.type == "cuda" and x.device.type == "cpu":
            _set(self, "last_route", f"host-streamed mask={kind}")
            return self._host_streamed(x, valid_token_mask, kind, weights, home)
        if self.plan.cuda_graph and x.is_cuda:
            return self._graph_forward(x, valid_token_mask, kind, weights)
        _set(self, "last_route", f"eager mask={kind}")
        return self._chunked(x, valid_token_mask, kind, weights)

    def _host_streamed(
        self,
        x: Tensor,
        mask: Tensor | None,
        kind: str,
        weights: list[_LayerWeights],
        device: torch.device,
    ) -> Tensor:
        """Input and output stay in host memory; batch chunks travel to the device and
        back on a copy stream, the next chunk's upload and the last chunk's download
        overlapped with compute. Pinned host memory makes the copies asynchronous."""
        b = x.shape[0]
        chunk = self.plan.batch_chunk if 0 < self.plan.batch_chunk < b else b
        out = torch.empty(x.shape, dtype=x.dtype, pin_memory=x.is_pinned())
        compute = torch.cuda.current_stream(device)
        copy = torch.cuda.Stream(device)
        use_mask = mask is not None and kind != MASK_NONE

        def upload(start: int) -> tuple[Tensor, Tensor | None, torch.cuda.Event]:
            with torch.cuda.stream(copy):
                xs = x[start : start + chunk].to(device, non_blocking=True)
                ms = mask[start : start + chunk].to(device, non_blocking=True) if use_mask else None
                ready = torch.cuda.Event()
                ready.record(copy)
            return xs, ms, ready

        starts = list(range(0, b, chunk))
        nxt = upload(starts[0])
        for i, start in enumerate(starts):
            xs, ms, ready = nxt
            compute.wait_event(ready)
            xs.record_stream(compute)
            if ms is not None:
                ms.record_stream(compute)
            if i + 1 < len(starts):
                nxt = upload(starts[i + 1])
            y = self._core(xs, ms, kind, weights)
            done = torch.cuda.Event()
            done.record(compute)
            with torch.cuda.stream(copy):
                copy.wait_event(done)
                out[start : start + chunk].copy_(y, non_blocking=True)
                y.record_stream(copy)
            del xs, ms, y
        copy.synchronize()  # the host reads ``out`` as soon as this returns
        return out

    def _chunked(
        self,
        x: Tensor,
        mask: Tensor | None,
        kind: str,
        weights: list[_LayerWeights],
        out: Tensor | None = None,
    ) -> Tensor:
        """The forward in the plan's batch chunks; into ``out`` when given (a captured
        graph's ring buffer: the fused layers write there themselves, no copy after)."""
        chunk = self.plan.batch_chunk
        if chunk <= 0 or chunk >= x.shape[0]:
            return self._into(out, x, mask if kind != MASK_NONE else None, kind, weights)
        if out is None:
            out = torch.empty_like(x)
        streams = self._chunk_streams(x)
        home = torch.cuda.current_stream(x.device) if streams else None
        for stream in streams:
            stream.wait_stream(home)  # x, out and the weights are ready on the caller's
        for i, start in enumerate(range(0, x.shape[0], chunk)):
            sl = slice(start, start + chunk)
            m = mask[sl] if (mask is not None and kind != MASK_NONE) else None
            if streams:
                # A chunk's sequences are independent of every other chunk's: chunk i on
                # stream i % N. Its activations come from that stream's own pool and are
                # freed there; the caller's stream waits for all of them below.
                with torch.cuda.stream(streams[i % len(streams)]):
                    self._into(out[sl], x[sl], m, kind, weights)
            else:
                self._into(out[sl], x[sl], m, kind, weights)
        for stream in streams:
            home.wait_stream(stream)
        return out

    def _chunk_streams(self, x: Tensor) -> list[torch.cuda.Stream]:
        """The side streams of ``batch_streams`` (made once per device), or none."""
        n = self.plan.batch_streams
        if n <= 1 or not x.is_cuda:
            return []
        if self._streams is None or self._streams[0].device != x.device:
            self._streams = [torch.cuda.Stream(x.device) for _ in range(n)]
        return self._streams

    def _into(
        self,
        out: Tensor | None,
        x: Tensor,
        mask: Tensor | None,
        kind: str,
        weights: list[_LayerWeights],
    ) -> Tensor:
        """The forward of ``x``, in ``out`` when given: written there by a fused layer
        family, copied there otherwise (the compiled forward takes no output buffer)."""
        if out is None:
            return self._core(x, mask, kind, weights)
        if self._core == self._forward_core:  # not compiled (a bound method: ==, not is)
            y = self._forward_core(x, mask, kind, weights, out)
        else:
            y = self._core(x, mask, kind, weights)
        if y.data_ptr() != out.data_ptr() or y.shape != out.shape:
            out.copy_(y)
        return out

    def _graph_forward(
        self, x: Tensor, mask: Tensor | None, kind: str, weights: list[_LayerWeights]
    ) -> Tensor:
        key = (x.shape, x.dtype, x.device, kind, settings_key())
        graphs = self._graphs
        with self._graph_lock:  # another thread's staging or replay must not interleave
            graph = graphs.pop(key, None)
            if graph is not None:
                graphs[key] = graph  # most recently used last: a dict move, no device work
            else:
                if len(graphs) >= self.MAX_GRAPH_SHAPES:  # many shapes: the least recent goes
                    del graphs[next(iter(graphs))]
                # The weights of now: another thread may have remade them (an edit) since
                # this call read them, and a graph captured on old ones would serve on.
                weights = self._weights or weights
                graph = _CapturedForward(
                    lambda xx, mm, out=None: self._chunked(xx, mm, kind, weights, out), x, mask
                )
                self._graphs[key] = graph
            _set(self, "last_route", f"graph mask={kind}")
            return graph.replay(x, mask)

    def _forward_core(
        self,
        x: Tensor,
        mask: Tensor | None,
        kind: str,
        weights: list[_LayerWeights],
        out: Tensor | None = None,
    ) -> Tensor:
        """The forward; a fused layer family, or the per-layer path's last LayerNorm,
        writes it into ``out`` when given (the caller copies whatever else comes back)."""
        if self._layer_backend.fused:
            if self._block is None:
                self._block = self._layer_backend.prepare(self)
            return self._layer_backend.forward(
                self._block, x, mask, self.plan, self.config, out=out
            )
        return self._unfused_forward(x, mask, kind, weights, out)

    def _unfused_forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        kind: str,
        weights: list[_LayerWeights],
        out: Tensor | None = None,
    ) -> Tensor:
        """The per-layer path; the final LayerNorm written into ``out`` when given (a
        batch chunk's rows of the output, a graph's ring buffer: no copy after it)."""
        norm, ffn = self._norm_backend, self._ffn_backend
        # Half GEMM operands handed along as they are: the GEMMs' half outputs go into the
        # fused add + LayerNorm and GELU kernels, which write the next GEMM's half operand
        # (rounded once, where a cast kernel would round it): the same values, without
        # the cast kernels around every GEMM.
        half = DTYPES.get(self.plan.gemm_precision) if norm.half_io and ffn.half_io else None
        fp32 = torch.float32
        # The first LayerNorm through the backend too: the Triton one writes the QKV GEMM's
        # half operand in the same pass (no fp32 output and cast kernel after it).
        _, h = norm.add_norm(x, None, *weights[0].n1, out_dtype=half or fp32)
        for i, w in enumerate(weights):
            a = self._attention(h, mask, kind, w, keep_half=half is not None)
            x, h = norm.add_norm(x, a, *w.n2, out_dtype=half or fp32)
            g = ffn.inner(h, w.ffn_in_w, w.ffn_in_b, self.plan.gemm_precision, half is not None)
            f = self._linear(g, w.ffn_out_w, w.ffn_out_b, keep_half=half is not None)
            last = i == len(weights) - 1
            nxt = self.final_norm if last else self.layers[i + 1].norm1
            # Padded rows are zeroed after every layer, and in the final norm's output.
            out_dtype = fp32 if last or half is None else half
            into = out if last and out is not None and out.dtype == out_dtype else None
            x, h = norm.add_norm(x, f, nxt.weight, nxt.bias, mask, last, out_dtype, into)
        return h

    def _linear(self, x: Tensor, weight: Tensor, bias: Tensor, keep_half: bool = False) -> Tensor:
        """x @ W^T + b at the plan's GEMM precision; fp32 out unless ``keep_half``."""
        return linear(x, weight, bias, self.plan.gemm_precision, keep_half)

    # --- attention ------------------------------------------------------------------
    def _attention(
        self, h: Tensor, mask: Tensor | None, kind: str, w: _LayerWeights, keep_half: bool = False
    ) -> Tensor:
        """The attention half of a layer: q, k, v, the backend, the output projection (its
        half output kept as it is with ``keep_half``)."""
        _b, _s, d = h.shape
        # fp16/bf16 GEMMs feeding attention of the same precision hand over their half
        # output as is: no round trip through fp32 (two kernels and 3x the bytes saved).
        keep = half_qkv(self.plan)
        # > 0 only with half q, k, v (drop_bits_reasons); positions along dim 1 of [B, S, C]
        plan = self.plan
        drop = (plan.attn_drop_bits, plan.attn_drop_bits_late, plan.attn_drop_late_from)
        if self.plan.qkv == "packed":
            qkv = self._linear(h, w.qkv_w, w.qkv_b, keep_half=keep)
            if any(drop):
                round_mantissa_(qkv, *drop)  # the GEMM's own output: one pass, in place
            q, k, v = qkv.split(d, dim=-1)
        else:
            q = self._linear(h, *w.q, keep_half=keep)
            k = self._linear(h, *w.k, keep_half=keep)
            v = self._linear(h, *w.v, keep_half=keep)
            if any(drop):
                for t in (q, k, v):
                    round_mantissa_(t, *drop)
        backend = self._attention_backend
        if kind == MASK_GENERAL and not backend.general_masks:
            backend = backends.attention("reference")  # the reference's arithmetic serves
        call = AttentionCall(q, k, v, mask, kind, self.plan, self.config, self.guard_log)
        # The reference zeroes the padded rows of this output; they reach nothing a valid
        # row reads (keys are masked, rows are independent) and the layer's end zeroes
        # them in x: the same result, two kernels fewer per layer.
        return self._linear(backend.attend(call), w.out_w, w.out_b, keep_half=keep_half)


def round_mantissa_(t: Tensor, drop: int, late: int = 0, late_from: int = 0) -> None:
    """``attn_drop_bits`` (graded: ``attn_drop_bits_late`` from ``attn_drop_late_from``):
    ``t`` ``[B, S, C]`` rounded in place (kernels.mantissa, imported on first use: Triton
    fixes interpreter mode per kernel at import)."""
    from kernels.mantissa import round_mantissa_ as rounded_in_place

    rounded_in_place(t, drop, late, late_from)


# The C method itself: torch's Python wrapper adds a debug tracker check per replay.
_replay: Callable[[Any], None] = getattr(getattr(torch._C, "_CUDAGraph", None), "replay", None) or (
    lambda graph: graph.replay()
)


def _storage_uses(t: Tensor) -> int:
    """How many tensors share ``t``'s storage (views included)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _CapturedForward:
    """The whole forward as CUDA graphs for one shape and mask contract.

    The mask kind the graphs were captured under is part of the key: every call checks
    the kind again, so a graph captured on an all-True mask never serves a padded input.

    A steady call is one graph replay and a hand-off, with as few device operations
    as are safe:
    - Inputs: a call whose ``x`` (and bool mask) sit at the same addresses as the call
      before (a serving loop that refills its input buffers) replays a graph captured on
      those addresses: the graph reads the caller's memory as it is at replay, so the
      content is always the current one, and no copy is made. Any other call copies its
      inputs into the graph's own buffers first.
    - Output: the caller owns what it gets, and no later call overwrites it. Outputs up
      to ``RING_BYTES`` are written by the graph into one of two buffers this object
      owns; a buffer is reused only once no tensor outside this object shares its
      storage (the caller dropped the output and every view of it), which its storage's
      use count says exactly. ``fn(x, mask, out)`` writes the forward into ``out`` (the
      fused layers' last kernel stores there; other forwards copy their result in,
      inside the graph). When both are still held, and for larger outputs, the graph's
      result is cloned for the caller (one device copy).
    Every graph of one object shares one memory pool: their replays are serialised on
    the stream, and what must outlive a replay (inputs, owned outputs) is outside it.
    """

    RING_BYTES = 64 << 20
    SLOTS = 2
    # False: the forward is captured into the graph's own output and copied into the ring
    # buffer inside the graph (before session 22), kept to time the two side by side
    # (scripts/ring_ab.py); read when an object is made, for all its captures.
    DIRECT_OUTPUT = True

    def __init__(self, fn: Callable[..., Tensor], x: Tensor, mask: Tensor | None) -> None:
        self.fn = fn
        self.direct_output = self.DIRECT_OUTPUT
        self.static_x = x.clone()
        self.static_mask = mask.clone() if mask is not None else None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy init, cuBLAS handles, autotuning
                out = fn(self.static_x, self.static_mask)
        torch.cuda.current_stream().wait_stream(stream)
        # cuBLAS handles are made per thread, and never inside a capture: a thread that
        # captures a graph of this object (a ring slot's, a bound one) warms its own first.
        self.warmed = {threading.get_ident()}
        self.pool = torch.cuda.graph_pool_handle()
        ring = out.numel() * out.element_size() <= self.RING_BYTES
        self.slots: list[Tensor | None] = [None] * (self.SLOTS if ring else 0)
        self.slot_base: list[tuple[int, int, int]] = [(0, 0, 0)] * len(self.slots)
        # (source, slot) -> (graph, its output); source "staged" or the direct pointers.
        self.graphs: dict[tuple[Any, int], tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.direct: tuple[int, int] | None = None  # the input addresses graphs read
        self.last_ptrs: tuple[int, int] | None = None
        self.static_out = self._graph("staged", -1, self.static_x, self.static_mask)[1]

    def _graph(
        self, source: Any, slot: int, x: Tensor, mask: Tensor | None
    ) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """The graph reading ``source``'s inputs (``x``, ``mask`` are them) and writing
        into ring buffer ``slot`` (-1: its own output), captured on first need."""
        found = self.graphs.get((source, slot))
        if found is not None:
            return found
        if threading.get_ident() not in self.warmed:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.fn(x, mask)  # this thread's cuBLAS handle and workspace, made here
            torch.cuda.current_stream().wait_stream(stream)
            self.warmed.add(threading.get_ident())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            if slot >= 0:
                buf = self.slots[slot]
                assert buf is not None
                if self.direct_output:
                    out = self.fn(x, mask, buf)  # the forward into the ring buffer itself
                else:
                    buf.copy_(self.fn(x, mask))
                    out = buf
            else:
                out = self.fn(x, mask)
        # A ring buffer is referenced from ``slots`` alone (its reference count says
        # whether the caller still holds it).
        self.graphs[(source, slot)] = (graph, out if slot < 0 else self.static_out)
        return self.graphs[(source, slot)]

    def _free_slot(self) -> int:
        """A ring buffer no caller holds (allocated on first need), or -1. The buffer is
        handed out as it is: the caller holds it while its Python reference count or its
        storage's use count (views) is above what this object alone accounts for."""
        slots = self.slots
        for i in range(len(slots)):
            buf = slots[i]
            if buf is None:
                buf = torch.empty_like(self.static_out)
                slots[i] = buf
                self.slot_base[i] = (sys.getrefcount(buf), _storage_uses(buf), buf.data_ptr())
                return i
            if (sys.getrefcount(buf), _storage_uses(buf), buf.data_ptr()) == self.slot_base[i]:
                return i
        return -1

    def replay(self, x: Tensor, mask: Tensor | None) -> Tensor:
        source: Any = "staged"
        if x.is_contiguous() and (
            mask is None or (mask.dtype == torch.bool and mask.is_contiguous())
        ):
            ptrs = (x.data_ptr(), 0 if mask is None else mask.data_ptr())
            if ptrs == self.direct:
                source = ptrs
            elif ptrs == self.last_ptrs:
                # The same addresses twice in a row: bind graphs to them (one binding kept).
                self.graphs = {k: v for k, v in self.graphs.items() if k[0] == "staged"}
                self.direct = source = ptrs
            self.last_ptrs = ptrs
        if source == "staged":
            self.static_x.copy_(x)
            if self.static_mask is not None and mask is not None:
                self.static_mask.copy_(mask)
            x, mask = self.static_x, self.static_mask
        slot = self._free_slot()
        graph, out = self._graph(source, slot, x, mask)
        _replay(graph)
        if slot < 0:
            return out.clone()
        return self.slots[slot]  # type: ignore[return-value]


def _raise_dynamo_limits() -> None:
    """Many shapes in one process must not hit the recompile limit and silently run eager."""
    cfg = torch._dynamo.config
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))
    if hasattr(cfg, "accumulated_cache_size_limit"):
        cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 4096)
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4096)
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True


def build_candidate(
    plan: Plan,
    config: TransformerConfig,
    device: DeviceInfo,
    state_dict: dict[str, Tensor] | None = None,
    *,
    owns_output: bool = True,
) -> CandidateTransformer:
    """Build the module for a plan, load weights, move to the device, eval mode.
    ``owns_output=False`` leaves a graphed compile mode's outputs as Inductor hands
    them out (the one line a user writes; not for serving)."""
    model = CandidateTransformer(config, plan, device)
    _set(model, "owns_output", owns_output)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model.to(device.torch_device).eval()
