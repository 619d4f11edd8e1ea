"""DLPack's C structs, written out again for the tests (not imported from ringworld, so that a
wrong layout there cannot agree with itself here), and PyCapsule_New for hand-made capsules."""

from __future__ import annotations

import ctypes


class Device(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class DataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class Tensor(ctypes.Structure):
    _fields_ = (("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32),
                ("dtype", DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64))


class Managed(ctypes.Structure):  # DLManagedTensor: what a legacy "dltensor" capsule holds
    _fields_ = (("dl_tensor", Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p))


capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype = ctypes.py_object
capsule_new.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
