"""Communicators, requests and the matching engine."""

from ringworld.comm.communicator import Communicator
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
    "Communicator",
    "Request",
    "Status",
    "test_all",
    "test_any",
    "wait_all",
    "wait_any",
]
