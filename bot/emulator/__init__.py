"""A Gitea v1.26.3 emulator (API subset, real bare git repositories, signed webhooks) for tests and demos."""

from bot.emulator.api import EMULATOR_ONLY_ROUTES, ROUTES, RecordedRequest, Route, build_app, start_emulator
from bot.emulator.core import Emulator
from bot.emulator.faults import FaultRule, Faults
from bot.emulator.model import EmuComment, EmuHook, EmuIssue, EmuLabel, EmuRepo, EmuUser, Perm
from bot.emulator.state import ApiError
from bot.emulator.webhooks import SentWebhook, go_json, sign_body

__all__ = [
    "EMULATOR_ONLY_ROUTES",
    "ROUTES",
    "ApiError",
    "EmuComment",
    "EmuHook",
    "EmuIssue",
    "EmuLabel",
    "EmuRepo",
    "EmuUser",
    "Emulator",
    "FaultRule",
    "Faults",
    "Perm",
    "RecordedRequest",
    "Route",
    "SentWebhook",
    "build_app",
    "go_json",
    "sign_body",
    "start_emulator",
]
