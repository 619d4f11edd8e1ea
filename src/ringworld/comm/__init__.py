"""Communicators, requests and the matching engine."""

from ringworld.comm.point_to_point import PointToPoint
from ringworld.comm.requests import (
    ANY_SOURCE,
    ANY_TAG,
    TAG_UB,
    Request,
    Status,
    test_all,
    test_any,
    wait_all,
    wait_any,
)

__all__ = [
    "ANY_SOURCE",
    "ANY_TAG",
    "TAG_UB",
    "PointToPoint",
    "Request",
    "Status",
    "test_all",
    "test_any",
    "wait_all",
    "wait_any",
]
