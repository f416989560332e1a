"""rclpy's parameter services made safe against any request (docs/reliability.md "Fuzzing through DDS").

rclpy's set_parameters and set_parameters_atomically services read each parameter with
``Parameter.from_parameter_msg``, which raises ValueError for a ParameterValue whose ``type`` is
not a ParameterType (any participant can send one: the field is a uint8). The exception leaves the
service callback, the executor raises it, and the node process ends. Here such a parameter is
refused with a reason naming it, as any other refused parameter, and the rest of the request goes
to rclpy's own callback unchanged.
"""
from __future__ import annotations

from rcl_interfaces.msg import SetParametersResult
from rcl_interfaces.srv import SetParameters, SetParametersAtomically
from rclpy.parameter import Parameter

VALID_TYPES = frozenset(t.value for t in Parameter.Type)


def type_refusal(param_msg) -> str:
    """Why a parameter message cannot be read ('' = it can)."""
    if param_msg.value.type in VALID_TYPES:
        return ""
    return (f"parameter '{param_msg.name}': value type {param_msg.value.type} is not a "
            f"rcl_interfaces/ParameterType (0-9)")


def _guard_set_parameters(callback):
    def guarded(request, response):
        refusals = [type_refusal(p) for p in request.parameters]
        if not any(refusals):
            return callback(request, response)
        readable = type(request)(parameters=[p for p, why in zip(request.parameters, refusals) if not why])
        results = iter(callback(readable, type(response)()).results)
        response.results = [SetParametersResult(successful=False, reason=why) if why else next(results)
                            for why in refusals]
        return response
    return guarded


def _guard_set_parameters_atomically(callback):
    def guarded(request, response):
        why = next((r for r in map(type_refusal, request.parameters) if r), "")
        if why:  # atomically: nothing is set
            response.result = SetParametersResult(successful=False, reason=why)
            return response
        return callback(request, response)
    return guarded


GUARDS = {SetParameters: _guard_set_parameters, SetParametersAtomically: _guard_set_parameters_atomically}


def guard_parameter_services(node) -> int:
    """Wrap ``node``'s set_parameters / set_parameters_atomically callbacks (rclpy's parameter
    services: the node makes no other service of these types); the number wrapped."""
    wrapped = 0
    for service in node.services:
        guard = GUARDS.get(service.srv_type)
        if guard is not None:
            service.callback = guard(service.callback)
            wrapped += 1
    return wrapped
