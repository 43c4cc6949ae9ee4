"""Past one GPU: the routed experts split across the ranks of a ``torch.distributed`` process group.

Every rank runs the whole model on all tokens (attention, routers, dense layers stay replicated) and
holds only its part of each experts module, so the experts' memory and the weight bytes read per token
divide by the group's size W. Each rank's experts produce a partial output; one all-reduce adds them.

Two splits (``mode``):

- ``"tp"`` (tensor parallel): every rank keeps all E experts and a contiguous slice of I: the matching
  gate rows and up rows of ``gate_up_proj`` with their scales, and the matching columns of
  ``down_proj`` with ``down_proj_scale`` unchanged (scales come from full rows, so the int8 values are
  the same on one GPU or many; experts without a gate: the slice's rows of ``up_proj``). The down products of
  the slices add up to the full one. Decode reads 1/W of every hit expert on each rank, so all ranks stay busy
  at any M.
- ``"ep"`` (expert parallel): every rank keeps E/W whole experts; ``expert_map`` sends pairs routed to
  other ranks' experts to the kernel's absent group, where they contribute zero.

Expert biases: ``tp`` slices the gate/up bias with its rows and adds the down bias on rank 0 only (it
would be counted W times otherwise); ``ep`` keeps each expert's biases with it.

Two ways in (``torchrun --nproc-per-node 2 script.py``, after ``dist.init_process_group("nccl")``):

    with split_while_loading("tp"):  # an int8 checkpoint: each rank reads only its part from the files
        model = AutoModelForCausalLM.from_pretrained(int8_path, dtype=torch.bfloat16, device_map=f"cuda:{rank}")

    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=ExpertsInt8Config(), dtype=torch.bfloat16)
    parallelize_experts(model, mode="tp", device=f"cuda:{rank}")  # a loaded model: split, each part moved
    model.to(f"cuda:{rank}")
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import NoReturn, Optional

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn

from .checkpoint import CheckpointKeys
from .layer import Int8Experts, carry_hooks, offloaded_by_accelerate, w13_name

MODES = ("tp", "ep")


def _split(n: int, parts: int, index: int) -> tuple[int, int]:
    """``[lo, hi)`` of part ``index`` when ``n`` items split into ``parts`` contiguous parts (the first
    ``n % parts`` parts one larger)."""
    base, extra = divmod(n, parts)
    lo = index * base + min(index, extra)
    return lo, lo + base + (index < extra)


@dataclass(frozen=True)
class Split:
    """One rank's place in a split of the experts: ``mode`` over ``world_size`` ranks."""

    mode: str
    rank: int
    world_size: int

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        ints = all(isinstance(n, int) and not isinstance(n, bool) for n in (self.rank, self.world_size))
        if not (ints and self.world_size >= 1 and 0 <= self.rank < self.world_size):
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank!r}, world_size={self.world_size!r}")

    def __str__(self) -> str:
        return f"rank {self.rank}'s {self.mode} part of a split over {self.world_size} ranks"

    def bounds(self, num_experts: int, intermediate_size: int) -> tuple[int, int]:
        """``[lo, hi)`` of this rank's columns of I (tp) or experts (ep)."""
        parts = intermediate_size if self.mode == "tp" else num_experts
        if self.world_size > parts:
            what, hint = ("columns of I", "") if self.mode == "tp" else ("experts", " or mode 'tp' (--parallel tp)")
            raise ValueError(f"cannot split {parts} {what} over {self.world_size} ranks; use fewer ranks{hint}")
        return _split(parts, self.world_size, self.rank)

    def take(self, tensor: str, t, lo: int, hi: int, intermediate_size: int, device) -> torch.Tensor:
        """This rank's part ``[lo, hi)`` of the whole experts tensor ``t`` named ``tensor`` (one of
        :meth:`Int8Experts.tensor_names`), as a new contiguous tensor on ``device``. ``t`` is a tensor or a safetensors
        slice: only basic slicing is used, so from a file only the part is read."""
        i = intermediate_size
        if self.mode == "ep":
            part = t[lo:hi]
        elif tensor.startswith("gate_up_proj"):  # the gate rows and the matching up rows (with scales, biases)
            part = torch.cat([t[:, lo:hi], t[:, i + lo:i + hi]], dim=1)
        elif tensor.startswith("up_proj"):  # experts without a gate: the slice's rows
            part = t[:, lo:hi]
        elif tensor == "down_proj":
            part = t[:, :, lo:hi]
        else:  # down scales come from whole rows: every rank keeps them; the down bias counts on rank 0 only
            part = t[:]
        # always a copy, of the part only: the whole tensor can be freed, and the shard never aliases it. Scales and
        # biases fp32 (a checkpoint saved from a model cast before 4124398 holds them in the model's float dtype)
        dtype = torch.float32 if part.is_floating_point() else part.dtype
        part = part.to(device=device, dtype=dtype, memory_format=torch.contiguous_format, copy=True)
        if self.mode == "tp" and tensor == "down_proj_bias" and self.rank != 0:
            part.zero_()
        return part

    def shard(self, like: Int8Experts, read, device) -> Int8Experts:
        """This rank's part of an experts module shaped as ``like`` (its tensors may be on the meta
        device), the whole tensors given by ``read(tensor_name)``."""
        e, h, i = like.num_experts, like.hidden_size, like.intermediate_size
        lo, hi = self.bounds(e, i)
        names = like.tensor_names()  # (w13, its scale, down, its scale[, w13's bias, down's bias])
        parts = [self.take(t, read(t), lo, hi, i, device) for t in names]
        local_e, local_i = (e, hi - lo) if self.mode == "tp" else (hi - lo, i)
        with torch.device("meta"):
            shard = Int8Experts(local_e, h, local_i, activation=like.activation, bias=like.has_bias,
                                gated=like.has_gate, global_num_experts=e, backend=like.backend, **like.swiglu_options)
        shard.part_of = self
        shard.load_quantized(*parts[:4])
        if like.has_bias:
            shard.load_biases(*parts[4:])
        if self.mode == "ep":
            expert_map = torch.full((e,), -1, dtype=torch.int32)
            expert_map[lo:hi] = torch.arange(hi - lo, dtype=torch.int32)
            shard.set_expert_map(expert_map.to(device))
        return shard


def _check_in_memory(name: str, module: Int8Experts) -> None:
    """Refuse an experts module whose tensors are on the meta device: accelerate's offload (a ``"cpu"`` or
    ``"disk"`` entry of a GPU model's device map) keeps them in its hook's weights map and brings them in for each
    forward only. A split of the meta tensors would be meta parts the hook no longer fills: the model would fail at
    its next forward, split already."""
    meta = [t for t in module.tensor_names() if getattr(module, t).device.type == "meta"]
    if not meta:
        return
    if offloaded_by_accelerate(module):
        raise ValueError(f"{name or 'this experts module'} is offloaded by accelerate (its tensors are on the meta "
                         f"device, brought in from its hook's weights map at each forward), which a split cannot "
                         f"read: load the model onto devices that hold its experts (no 'cpu' or 'disk' entries for "
                         f"them in device_map) before splitting it")
    tensor = f"{name}.{meta[0]}" if name else f"this experts module's {meta[0]}"
    raise ValueError(f"{tensor} is on the meta device (not loaded): load the weights before splitting")


def shard_experts(module: Int8Experts, mode: str, rank: int, world_size: int,
                  device: Optional[torch.device | str] = None) -> Int8Experts:
    """Rank ``rank``'s part of ``module`` under ``mode`` (see the module docstring), as a new
    :class:`Int8Experts` with its own (contiguous) tensors on ``device`` (default: the module's)."""
    if not isinstance(module, Int8Experts):
        raise TypeError(f"shard_experts takes an Int8Experts module (quantize the model first), got "
                        f"{type(module).__name__}")
    split = Split(mode, rank, world_size)
    if module.part_of is not None or module.expert_map is not None:
        raise ValueError(f"this experts module is already {module.part_of or 'a shard (it has an expert_map)'}; "
                         f"split whole experts once")
    _check_in_memory("", module)
    device = torch.device(device) if device is not None else module.down_proj.device
    return split.shard(module, lambda t: getattr(module, t), device)


class ParallelExperts(nn.Module):
    """One rank's part of an experts module (``local``), and the all-reduce that adds the ranks' partial
    outputs: called like any transformers 5 experts module."""

    def __init__(self, local: Int8Experts, mode: str, group: Optional[dist.ProcessGroup] = None):
        part_of = getattr(local, "part_of", None)
        if not isinstance(local, Int8Experts) or part_of is None or part_of.mode != mode:
            # (the forward and the repr read the split: a whole module failed there with an AttributeError on None)
            got = f"{part_of}" if isinstance(part_of, Split) else f"a whole {type(local).__name__}"
            raise ValueError(f"ParallelExperts({mode!r}) wraps one rank's {mode} part of an experts module, made by "
                             f"shard_experts (parallelize_experts splits a whole model); got {got}")
        super().__init__()
        self.local, self.mode, self.group = local, mode, group
        self.register_state_dict_pre_hook(_refuse_saving_a_part)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        split = self.local.part_of
        rank, world_size = dist.get_rank(self.group), dist.get_world_size(self.group)  # (local queries, no traffic)
        if (rank, world_size) != (split.rank, split.world_size):  # (a split model pickled, then loaded elsewhere)
            raise RuntimeError(f"these experts hold {split}, but this process is rank {rank} of {world_size} in "
                               f"their group: the ranks' parts would sum to wrong outputs. Load and split the "
                               f"checkpoint in this group instead (experts_int8.parallel)")
        if torch.is_grad_enabled() and (hidden_states.requires_grad or top_k_weights.requires_grad):
            # every rank holds the same inputs and, after the sum, the same output: a gradient through its
            # part alone is that part's share, so the inputs' gradients are summed over the ranks, the output's not.
            # The sum takes the inputs too, so that every rank's backward reaches the inputs' all-reduce, also a
            # rank none of whose experts got a token (its part is zeros, linked to nothing).
            hidden_states, top_k_weights = _SameOnEveryRank.apply(hidden_states, top_k_weights, self.group)
            part = self.local(hidden_states, top_k_index, top_k_weights)
            return _SumOverRanks.apply(part, hidden_states, top_k_weights, self.group)
        out = self.local(hidden_states, top_k_index, top_k_weights)
        dist.all_reduce(out, group=self.group)
        return out

    def extra_repr(self) -> str:  # (from the split: no call into a process group, which may be gone)
        return f"mode={self.mode}, world_size={self.local.part_of.world_size}"


class _SumOverRanks(torch.autograd.Function):
    """The ranks' partial outputs summed; the sum's gradient passes to each rank's part unchanged (and nothing
    to the inputs given alongside, which only keep every rank's backward going through them)."""

    @staticmethod
    def forward(ctx, partial: torch.Tensor, hidden_states: torch.Tensor, weights: torch.Tensor, group):
        ctx.inputs = [(t.shape, t.dtype, t.device) for t in (hidden_states, weights)]
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (grad, *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.inputs), None)


class _SameOnEveryRank(torch.autograd.Function):
    """Inputs every rank holds alike: their gradients are the sums of what each rank's part gives them (one
    backward, two all-reduces in a fixed order on every rank)."""

    @staticmethod
    def forward(ctx, hidden_states: torch.Tensor, weights: torch.Tensor, group):
        ctx.group = group
        return hidden_states.view_as(hidden_states), weights.view_as(weights)

    @staticmethod
    def backward(ctx, grad_hidden: torch.Tensor, grad_weights: torch.Tensor):
        sums = [grad_hidden.clone(), grad_weights.clone()]
        for total in sums:
            dist.all_reduce(total, group=ctx.group)
        return (*sums, None)


def _refuse_saving_a_part(module: "ParallelExperts", prefix: str, keep_vars: bool) -> None:
    # A rank's part saved as the module would make a checkpoint that holds one slice of every experts tensor
    # (save_pretrained writes rank 0's alone) and then fails to load as incomplete.
    raise ValueError(f"{prefix.rstrip('.') or 'these experts'} hold only {module.local.part_of} (parallel.py): a "
                     f"checkpoint of it would lack the other ranks' parts. Save the model before splitting it")


def _require_dist(what: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{what} needs torch.distributed initialized on every rank first "
                           f"(dist.init_process_group, e.g. under torchrun)")


def _split_over(group: Optional[dist.ProcessGroup], mode: str, what: str) -> "Split":
    """This process's Split over ``group`` (default: the whole world); a process outside it is refused."""
    _require_dist(what)
    # (dist.new_group gives a process outside the group a marker in place of a ProcessGroup)
    outside = group is dist.GroupMember.NON_GROUP_MEMBER
    if group is not None and not outside and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{what}: group must be a torch.distributed ProcessGroup (dist.new_group) or None for "
                        f"the whole world, got {type(group).__name__}")
    if outside or dist.get_rank(group) < 0:
        raise ValueError(f"{what}: this process (global rank {dist.get_rank()}) is not in the group given; call it "
                         f"on the group's ranks only")
    return Split(mode, dist.get_rank(group), dist.get_world_size(group))


def _exchange(payload, split: Split, group: Optional[dist.ProcessGroup],
              device: Optional[torch.device | str]) -> list:
    """Every rank's ``payload``, in rank order. (NCCL exchanges objects through the current CUDA device:
    ``device``, this rank's, where given.)"""
    everyone = [None] * split.world_size
    loading = _LOADING.get()
    if loading is not None:  # (every rank takes part in this exchange)
        loading.owes_exchange = False
    with _on_cuda_device(device):
        dist.all_gather_object(everyone, payload, group=group)
    return everyone


def _on_cuda_device(device):
    """``torch.cuda.device(device)`` where this process has that CUDA device, else no change. A device this rank cannot
    use (an index past its GPUs, a CPU build of torch) raised here, before the exchange, and the other ranks waited in
    it until the process group timed out; it now fails where this rank's part is moved there, after the exchange, and
    that failure reaches them in the exchange that ends the split (:func:`_raise_refusals`)."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):  # (None, or no device at all: it fails where it is used)
        return nullcontext()
    usable = device.type == "cuda" and device.index is not None and device.index < torch.cuda.device_count()
    return torch.cuda.device(device) if usable else nullcontext()


def _raise_refusals(everyone: list, what: str) -> None:
    """Raise the first refusal among the ranks' payloads ``(refusal or None, ...)`` of one exchange."""
    for rank, (refused, _) in enumerate(everyone):
        if refused is not None:
            raise ValueError(f"{what}: rank {rank} refused, so no rank splits anything: {refused}")


def _all_ranks_done(split: Split, group: Optional[dist.ProcessGroup], device, what: str) -> None:
    """The exchange that ends a split, after every rank has made its parts (a rank that failed making them joins it
    with its error, :func:`refuse_on_every_rank`): without it, a rank whose own part failed (out of memory, a tensor
    missing from its files, its slice of the scales corrupt) raised alone, and the others went on with their parts
    to wait for it in their first forward's all-reduce until the process group timed out."""
    _raise_refusals(_exchange((None, None), split, group, device), what)


def refuse_on_every_rank(error: Exception, split: Split, group: Optional[dist.ProcessGroup],
                         device: Optional[torch.device | str] = None) -> NoReturn:
    """Raise ``error``, a refusal or failure of this rank alone (its own device map, an offloaded module, out of
    memory), after telling the other ranks in the exchange they wait in (:func:`_check_ranks_agree`'s or
    :func:`_all_ranks_done`'s), so that they raise too instead of waiting there until the process group times out."""
    _exchange((str(error), None), split, group, device)
    raise error


@contextmanager
def refusing_on_every_rank(split: Split, group: Optional[dist.ProcessGroup],
                           device: Optional[torch.device | str] = None):
    """Around work a rank does before its next exchange of shapes (a whole load before :func:`parallelize_experts`):
    an exception inside goes to the other ranks (:func:`refuse_on_every_rank`), which would otherwise wait for this
    rank in that exchange until the process group timed out."""
    try:
        yield
    except Exception as e:
        refuse_on_every_rank(e, split, group, device)


def _check_ranks_agree(model: nn.Module, modules, split: Split, group: Optional[dist.ProcessGroup], what: str,
                       device: Optional[torch.device | str] = None):
    """Refuse ranks that would split different things (another mode, checkpoint or model): each would add its
    part of another model into the all-reduce, which needs only equal output shapes, and give wrong text silently.
    One exchange of shapes at split time; weights of equal shapes are not compared. A rank's own refusal
    travels in the same exchange (:func:`refuse_on_every_rank`): every rank raises, none splits."""
    text = model.config.get_text_config() if hasattr(getattr(model, "config", None), "get_text_config") else None
    dims = tuple(getattr(text, key, None) for key in ("vocab_size", "hidden_size", "num_hidden_layers"))
    mine = (split.mode, split.world_size, (type(model).__name__, *dims),
            [(name, tuple(m.get_parameter(w13_name(m)).shape), tuple(m.down_proj.shape)) for name, m in modules])
    everyone = _exchange((None, mine), split, group, device)
    _raise_refusals(everyone, what)
    for rank, (_, theirs) in enumerate(everyone):
        if theirs != mine:
            labels = ("mode", "world size", "model (class, vocab, hidden size, layers)")
            said = next((f"{label} {a!r} against {b!r}" for label, a, b in zip(labels, mine, theirs) if a != b), None)
            said = said or next((f"{a[0]} of shapes {a[1:]} against {b[0]} of shapes {b[1:]}"
                                 for a, b in zip(mine[3], theirs[3]) if a != b), None)
            said = said or f"{len(mine[3])} experts modules against {len(theirs[3])}"
            raise ValueError(f"{what}: ranks {split.rank} and {rank} disagree ({said}); every rank must load the "
                             f"same checkpoint and split it with the same mode")


# --------------------------------------------------------------------------------------------------
# Loading an int8 checkpoint split: each rank reads only its part of the experts from the files
# --------------------------------------------------------------------------------------------------
@dataclass
class Loading:
    """What :func:`split_while_loading` asks of the loads inside it, and how many experts modules they split."""

    split: Split
    group: Optional[dist.ProcessGroup]
    device: Optional[torch.device | str]
    parts: int = 0
    # Whether the other ranks may be waiting for this one in an exchange: from the context's start and each load's
    # until this rank has taken part in the load's exchange of shapes, and again from then (its parts are read) until
    # the load's end has exchanged once more (finish_load).
    owes_exchange: bool = True
    # Where the load's exchanges run, between its exchange of shapes and its end (None: no exchange owed at the end)
    exchange_on: Optional[torch.device | str] = None


_LOADING: ContextVar[Optional[Loading]] = ContextVar("experts_int8_split_while_loading", default=None)


@contextmanager
def split_while_loading(mode: str = "tp", group: Optional[dist.ProcessGroup] = None,
                        device: Optional[torch.device | str] = None):
    """Inside this context, ``from_pretrained`` of an experts_int8 (int8) checkpoint gives this rank only its
    part of every experts module (``mode`` over ``group``), read from the safetensors files slice by slice
    onto ``device`` (default: where transformers places the module) and wrapped in :class:`ParallelExperts`.
    No rank ever holds the whole experts. A float checkpoint raises here, and so does a context that split
    nothing: quantize the checkpoint once (``experts-int8 quantize``), or load it whole and call
    :func:`parallelize_experts`.

    A load exchanges twice between the ranks: the shapes, before the parts are read, and the outcome, at its end
    (:func:`finish_load`). A rank that fails inside the context while the others would wait for it in one of them
    (its own device map refused, a missing file or tensor, out of memory) tells them there as it leaves, so that
    they raise with its reason instead of waiting until the process group times out."""
    from .integrations import transformers as _  # noqa: F401  -- registers quant_method "experts_int8"

    loading = Loading(_split_over(group, mode, "split_while_loading"), group, device)
    token = _LOADING.set(loading)
    try:
        yield
        if loading.parts == 0:  # (a float checkpoint without ExpertsInt8Config loads whole, past our quantizer)
            raise ValueError("split_while_loading split no experts: what loaded inside it was not an experts_int8 "
                             "(int8) checkpoint of a MoE model, so every rank holds it whole. Quantize the checkpoint "
                             "once (experts-int8 quantize), or load it whole and call parallelize_experts")
    except Exception as e:
        if loading.owes_exchange:
            refuse_on_every_rank(e, loading.split, loading.group, loading.exchange_on or loading.device)
        raise
    finally:
        _LOADING.reset(token)


def loading_split() -> Optional[Loading]:
    """The :class:`Loading` of the :func:`split_while_loading` around this call, else None (for the quantizer)."""
    return _LOADING.get()


class PendingShard(nn.Module):
    """Holds an experts module's place while transformers loads the rest of the model. It has no tensors,
    so transformers reads none of the checkpoint's whole experts tensors; ``like`` (on the meta device)
    says which module's part :func:`fill_pending_shards` will read."""

    def __init__(self, like: Int8Experts):
        super().__init__()
        object.__setattr__(self, "like", like)  # not a submodule: its meta tensors are not the model's


def fill_pending_shards(model: nn.Module, files, loading: Loading, device_for) -> int:
    """Replace every :class:`PendingShard` of ``model`` by this rank's part of its module (``loading``'s split),
    read from the safetensors ``files`` (keys: the module's name + tensor name) onto ``device_for(name)``, in a
    :class:`ParallelExperts`. Returns how many; if any, the load ends with :func:`finish_load`."""
    pending = [(name, m) for name, m in model.named_modules() if isinstance(m, PendingShard)]
    split, group = loading.split, loading.group
    exchange_on = device_for(pending[0][0]) if pending else loading.device
    # (also where nothing is to split, every experts module kept float: each load that reaches the quantizer
    # exchanges its shapes once on every rank, so that a rank splitting something meets the others' empty list)
    _check_ranks_agree(model, [(name, slot.like) for name, slot in pending], split, group, "split_while_loading",
                       exchange_on)
    if not pending:
        return 0
    # Every rank agreed and reads its parts now: what fails from here to the load's end (a tensor missing from this
    # rank's files, out of memory, its slice of the scales corrupt) is this rank's alone. split_while_loading's exit
    # sends it to the other ranks, which wait for it in finish_load.
    loading.owes_exchange, loading.exchange_on = True, exchange_on
    with ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt")) for f in files
                   if str(f).endswith(".safetensors")]
        where = {key: h for h in handles for key in h.keys()}
        keys = CheckpointKeys(where)
        for name, slot in pending:
            def read(tensor: str, name=name):
                key = keys.find(f"{name}.{tensor}")
                if key is None:
                    raise ValueError(f"the checkpoint has no tensor for {name}.{tensor}")
                return where[key].get_slice(key)
            part = split.shard(slot.like, read, device_for(name))
            model.set_submodule(name, ParallelExperts(part, split.mode, group))
    return len(pending)


def finish_load(loading: Loading) -> None:
    """The end of a load whose experts :func:`fill_pending_shards` split (after the quantizer's checks of the
    parts): every rank's outcome, so that a rank that failed alone since the exchange of shapes makes the others
    raise too (:func:`_all_ranks_done`). Nothing where the load split nothing."""
    if loading.exchange_on is None:
        return
    exchange_on, loading.exchange_on = loading.exchange_on, None
    _all_ranks_done(loading.split, loading.group, exchange_on, "split_while_loading")


def parallelize_experts(model: nn.Module, mode: str = "tp", group: Optional[dist.ProcessGroup] = None,
                        device: Optional[torch.device | str] = None) -> nn.Module:
    """Replace every :class:`Int8Experts` in ``model`` by this rank's part of it (``mode`` ``"tp"`` or
    ``"ep"``, over ``group``, default the whole world) wrapped in a :class:`ParallelExperts`; each part
    moves to ``device`` (default: where the module is). In place; returns ``model`` (for a lone
    :class:`Int8Experts`, its wrapped part). Call it on every
    rank with the same model (same weights), after ``dist.init_process_group``. The result is for inference:
    save a checkpoint before splitting (each rank holds only its part)."""
    split = _split_over(group, mode, "parallelize_experts")  # checks mode and group before any work
    # (a refusal of this rank alone goes to the others in the shapes' exchange: they raise too, none waits)
    with refusing_on_every_rank(split, group, device):
        targets = _targets(model)
    exchange_on = device or targets[0][1].down_proj.device
    _check_ranks_agree(model, targets, split, group, "parallelize_experts", exchange_on)
    # Every part made before any takes its module's place (the whole modules stay alive until the end either way): a
    # failure of this rank alone (out of memory, a device it lacks) leaves its model whole and reaches the other ranks
    # in the exchange that ends the split, where they leave theirs whole too, instead of a model split on some ranks
    # and half split on this one.
    with refusing_on_every_rank(split, group, exchange_on):
        parts = [ParallelExperts(shard_experts(module, mode, split.rank, split.world_size, device), mode, group)
                 for _, module in targets]
    _all_ranks_done(split, group, exchange_on, "parallelize_experts")
    for (name, module), wrapped in zip(targets, parts):
        carry_hooks(module, wrapped)  # (a user's hooks see the whole layer's output, as before the split)
        if name:  # ("": a lone experts module, returned below)
            model.set_submodule(name, wrapped)
    if isinstance(model, Int8Experts):  # a lone experts module: its part, wrapped
        return parts[0]
    if getattr(model, "hf_quantizer", None) is not None:  # save_pretrained asks it before writing anything
        model.hf_quantizer.split = split
    return model


def _targets(model: nn.Module) -> list[tuple[str, Int8Experts]]:
    """The experts modules :func:`parallelize_experts` splits (name, module); refuses what it cannot split, all
    checked before any is split, so that a refusal leaves the model whole."""
    if isinstance(model, Int8Experts):
        _check_in_memory("", model)
        return [("", model)]
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, Int8Experts)]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no Int8Experts modules: quantize it first "
                         f"(ExpertsInt8Config when loading, or quantize_)")
    split_already = [(name, m.part_of) for name, m in targets if m.part_of is not None]
    if split_already:
        raise ValueError(f"{split_already[0][0]} is already {split_already[0][1]}: split the whole model once")
    for name, module in targets:
        _check_in_memory(name, module)
    return targets


__all__ = ["MODES", "Loading", "ParallelExperts", "PendingShard", "Split", "fill_pending_shards", "finish_load",
           "loading_split", "parallelize_experts", "refuse_on_every_rank", "refusing_on_every_rank", "shard_experts",
           "split_while_loading"]
