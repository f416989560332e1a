"""Sending what a Python client cannot: a service request whose string holds bytes that are not
UTF-8 (a C++ client or a broken bridge can send those; rclpy's own conversion encodes str only).

The request's generated C conversion is wrapped: it converts a placeholder of the same length, then
the placeholder's bytes in the C message are overwritten before rcl sends it. The wrapper class keeps
the generated class's module and name (the C conversion asserts them)."""
from __future__ import annotations

import ctypes

_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# PYFUNCTYPE: the generated conversion uses the Python C API, so the GIL must stay held
_CONVERT = ctypes.PYFUNCTYPE(ctypes.c_bool, ctypes.py_object, ctypes.c_void_p)
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.py_object, ctypes.c_void_p)


class _RosString(ctypes.Structure):  # rosidl_runtime_c__String
    _fields_ = [("data", ctypes.POINTER(ctypes.c_char)), ("size", ctypes.c_size_t), ("capacity", ctypes.c_size_t)]


def request_with_raw_first_string(request_type, raw: bytes, **fields):
    """An instance of (a subclass of) ``request_type`` whose first field, a string, goes out as the
    bytes ``raw``; ``fields`` sets the others."""
    type(request_type).__import_type_support__()
    original = request_type._CONVERT_FROM_PY
    name = _api.PyCapsule_GetName(original)
    convert_original = _CONVERT(_api.PyCapsule_GetPointer(original, name))

    def convert(pymsg, ros_message):
        if not convert_original(pymsg, ros_message):
            return False
        string = _RosString.from_address(ros_message)
        if string.size != len(raw):
            return False
        ctypes.memmove(string.data, raw, len(raw))
        return True

    callback = _CALLBACK(convert)
    capsule = _api.PyCapsule_New(ctypes.cast(callback, ctypes.c_void_p), name, None)
    raw_type = type(request_type.__name__, (request_type,),
                    {"_CONVERT_FROM_PY": capsule, "_keep_alive": (callback, convert_original),
                     "__module__": request_type.__module__})
    first = request_type.get_fields_and_field_types()
    first_name = next(iter(first))
    return raw_type(**{first_name: "x" * len(raw), **fields})
