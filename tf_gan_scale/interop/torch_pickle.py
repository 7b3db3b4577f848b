"""PyTorch objects in a pickle, read without PyTorch and without running their code.

An official StyleGAN2-ADA snapshot (`network-snapshot-XXXXXX.pkl`) is a plain pickle of a
dict holding torch modules that `torch_utils.persistence` made pickleable with their
SOURCE CODE embedded: the official loader executes that source (`exec` in
`_src_to_module`) to rebuild the classes. Loading it the official way runs whatever code
the file carries. Here the pickle is read by an Unpickler whose `find_class` knows a
closed list of globals (ALLOWED): every one is replaced by a function of ours that only
builds data (numpy arrays, dicts, `Persistent` records of a module's state); any other
global (os.system, builtins.eval, a torch class we do not know) is a `PickleRefused`
naming it, before it could be called. The embedded source is kept as a string and never
executed.

What a snapshot holds, and how it is rebuilt (torch 1.x and 2.x write the same):
  torch_utils.persistence._reconstruct_persistent_obj(meta)   a module: meta = {type,
      version, module_src, class_name, state}, state its __dict__ (_parameters, _buffers,
      _modules, _init_args, _init_kwargs, ...)                   -> Persistent
  torch._utils._rebuild_parameter(data, requires_grad, hooks)     -> data
  torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)  -> numpy array
  torch.storage._load_from_bytes(b)   a storage as torch.save's legacy byte format: five
      pickles (magic number, protocol 1001, system info, the storage's persistent id
      ('storage', torch.<Kind>Storage, key, location, numel, view), the keys), then per
      key an int64 element count and the raw little-endian bytes  -> numpy 1-D array
  collections.OrderedDict, dnnlib.util.EasyDict (a dict), numpy's array / dtype /
  scalar reconstructors (data only).

    objects = torch_pickle.load("network-snapshot-000000.pkl")
    g = objects["G_ema"]                     # a Persistent
    g.class_name, g.init_kwargs["z_dim"]     # "Generator", 512
    torch_pickle.state_dict(g)               # {"mapping.fc0.weight": ndarray, ...}
"""

import collections
import io
import pickle

import numpy as np

from tf_gan_scale import errors

# torch.<Kind>Storage -> the numpy dtype of its elements (bfloat16 has none in numpy).
STORAGE_DTYPES = {"FloatStorage": np.float32, "DoubleStorage": np.float64,
                  "HalfStorage": np.float16, "LongStorage": np.int64, "IntStorage": np.int32,
                  "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
                  "BoolStorage": np.bool_}
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
LEGACY_PROTOCOL = 1001


class PickleRefused(errors.ConfigError):
    """The pickle is not one this reader accepts (a global outside ALLOWED, or a torch
    format it does not know). Nothing of it was executed."""


class Persistent:
    """A module pickled by torch_utils.persistence: its class name, the source module's
    text (never executed) and its state (the module's __dict__, tensors as numpy)."""

    def __init__(self, meta):
        meta = dict(meta)
        if meta.get("type") != "class":
            raise PickleRefused(f"a persistent object of type {meta.get('type')!r}; valid: "
                                f"'class' (torch_utils.persistence)")
        self.class_name = meta["class_name"]
        self.module_src = meta.get("module_src", "")
        self.state = dict(meta.get("state") or {})

    @property
    def init_kwargs(self):
        """The keyword arguments the official code built the module with."""
        return dict(self.state.get("_init_kwargs") or {})

    def children(self):
        """{name: Persistent or Module} of its sub-modules, in order."""
        return dict(self.state.get("_modules") or {})

    def __repr__(self):
        return f"Persistent({self.class_name})"


class Module:
    """A torch.nn module pickled the plain way (a class of torch.nn.modules, rebuilt as
    an empty record and its __dict__ set by BUILD)."""

    class_name = "Module"

    def __setstate__(self, state):
        self.state = dict(state)

    def children(self):
        return dict(getattr(self, "state", {}).get("_modules") or {})


class EasyDict(dict):
    """dnnlib.util.EasyDict's data: a dict (attribute access is not needed here)."""

    def __setstate__(self, state):
        self.update(state or {})


class _Storage(np.ndarray):
    """A storage read by `_load_from_bytes` (1-D, a STORAGE_DTYPES dtype): the only thing
    `_rebuild_tensor_v2` views."""


def _storage_kind(name):
    def kind():
        raise PickleRefused(f"torch.{name} called")
    kind.storage_name = name
    return kind


def _load_from_bytes(data):
    """torch.storage._load_from_bytes: torch.save's legacy format -> a 1-D numpy array."""
    f = io.BytesIO(data)
    header = [_Inner(f).load() for _ in range(3)]
    if header[0] != LEGACY_MAGIC or header[1] != LEGACY_PROTOCOL:
        raise PickleRefused(f"a tensor storage in a torch.save format this reader does not "
                            f"know (magic {header[0]!r}, protocol {header[1]!r}); valid: "
                            f"the legacy format {LEGACY_PROTOCOL} plain pickles use")
    inner = _Inner(f)
    inner.load()  # The storage's persistent id (inner.storages records it).
    keys = _Inner(f).load()
    if not header[2].get("little_endian", True):
        raise PickleRefused("a big-endian torch storage; valid: little-endian")
    arrays = {}
    for key in keys:
        count = int(np.frombuffer(f.read(8), "<i8")[0])
        dtype = np.dtype(STORAGE_DTYPES[inner.storages[key]]).newbyteorder("<")
        arrays[key] = np.frombuffer(f.read(count * dtype.itemsize), dtype, count)
    (key,) = inner.storages  # One storage per _load_from_bytes.
    return arrays[key].view(_Storage)


def _rebuild_tensor_v2(storage, offset, size, stride, *unused):
    """A tensor view of `storage` -> a numpy array of its own (C order). The view must lie
    inside the storage: a crafted offset, size or stride would read other memory."""
    del unused
    if not isinstance(storage, _Storage):
        raise PickleRefused(f"a tensor whose storage is a {type(storage).__name__}; valid: "
                            f"a storage of torch.storage._load_from_bytes")
    size, stride = tuple(size), tuple(stride)
    numbers = (offset,) + size + stride
    if (len(size) != len(stride) or not all(type(n) is int and n >= 0 for n in numbers)
            or (all(size) and offset + sum((n - 1) * s for n, s in zip(size, stride))
                >= storage.size)):
        raise PickleRefused(f"a tensor view (offset {offset}, size {size}, stride {stride}) "
                            f"outside its storage of {storage.size} elements")
    if not all(size):
        return np.zeros(size, storage.dtype)
    item = storage.itemsize
    base = np.asarray(storage)
    view = np.lib.stride_tricks.as_strided(base[offset:], size,
                                           tuple(s * item for s in stride), writeable=False)
    return np.array(view)


def _dtype(*args, **kwargs):
    """numpy.dtype, without object dtypes (arrays of pointers)."""
    dtype = np.dtype(*args, **kwargs)
    if dtype.hasobject:
        raise PickleRefused(f"a numpy dtype {dtype} that holds Python objects")
    return dtype


def _rebuild_parameter(data, *unused):
    return data


def _ordered_dict(*args):
    return collections.OrderedDict(*args)


def _reconstruct_persistent_obj(meta):
    return Persistent(meta)


_MULTIARRAY = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray

# (module, name) -> what the unpickler builds instead. Nothing here runs pickled code.
ALLOWED = {
    ("torch_utils.persistence", "_reconstruct_persistent_obj"): _reconstruct_persistent_obj,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch.storage", "_load_from_bytes"): _load_from_bytes,
    ("collections", "OrderedDict"): _ordered_dict,
    ("dnnlib.util", "EasyDict"): EasyDict,
    ("numpy.core.multiarray", "_reconstruct"): _MULTIARRAY._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _MULTIARRAY._reconstruct,
    ("numpy.core.multiarray", "scalar"): _MULTIARRAY.scalar,
    ("numpy._core.multiarray", "scalar"): _MULTIARRAY.scalar,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
}


def _torch_module(module):
    return module == "torch.nn" or module.startswith("torch.nn.modules.")


class _Outer(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in ALLOWED:
            return ALLOWED[(module, name)]
        if _torch_module(module):  # A plain torch.nn module's class: an empty record.
            return type(name, (Module,), {"class_name": name})
        raise PickleRefused(
            f"the pickle references {module}.{name}, which this reader does not load (it "
            f"runs no code from a pickle); valid: an official StyleGAN2-ADA snapshot, "
            f"whose globals are {', '.join(sorted(f'{m}.{n}' for m, n in ALLOWED))}")

    def persistent_load(self, pid):
        raise PickleRefused(f"a persistent id {pid!r} in the snapshot's own pickle; valid: "
                            f"tensors stored as torch.storage._load_from_bytes")


class _Inner(pickle.Unpickler):
    """The pickles inside a legacy storage: only torch.<Kind>Storage globals."""

    def __init__(self, f):
        super().__init__(f)
        self.storages = {}

    def find_class(self, module, name):
        if module == "torch" and name in STORAGE_DTYPES:
            return _storage_kind(name)
        raise PickleRefused(f"a tensor storage references {module}.{name}; valid: "
                            f"torch.{{{', '.join(STORAGE_DTYPES)}}}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise PickleRefused(f"a storage id {pid!r}; valid: ('storage', kind, key, ...)")
        kind, key = pid[1], pid[2]
        name = getattr(kind, "storage_name", None)
        if name is None:
            raise PickleRefused(f"a storage of kind {kind!r}; valid: torch.<Kind>Storage")
        self.storages[key] = name
        return key


def load(path):
    """The objects of the pickle at `path`, read without PyTorch and without running any
    code it carries (module docstring). PickleRefused names what it will not load."""
    with open(path, "rb") as f:
        try:
            return _Outer(f).load()
        except PickleRefused:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError,
                AttributeError, IndexError, MemoryError, OverflowError) as e:
            raise PickleRefused(f"{path} is not a readable pickle ({type(e).__name__}: "
                                f"{e}); valid: a network-snapshot-XXXXXX.pkl of "
                                f"StyleGAN2-ADA") from None


def state_dict(module, prefix=""):
    """{"a.b.weight": ndarray} of a Persistent / Module and its sub-modules: parameters
    and buffers, as torch's module.state_dict() names them (None buffers left out)."""
    out = {}
    state = getattr(module, "state", {})
    for key in ("_parameters", "_buffers"):
        for name, value in (state.get(key) or {}).items():
            if value is not None:
                out[prefix + name] = value
    for name, child in module.children().items():
        if child is not None:
            out.update(state_dict(child, f"{prefix}{name}."))
    return out
