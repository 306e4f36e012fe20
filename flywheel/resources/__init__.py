"""Dagster resources: thin typed wrappers that build the plain core objects."""

from flywheel.resources.envs import EnvResource
from flywheel.resources.loop import LoopResource
from flywheel.resources.policy import (
    ManagedVLLMPolicy,
    OpenAICompatiblePolicy,
    PolicyResource,
    TransformersPolicy,
    make_policy,
)
from flywheel.resources.store import StoreResource
from flywheel.resources.teacher import OpenAITeacherResource, ScriptedTeacherResource, TeacherResource

__all__ = [
    "EnvResource", "LoopResource", "ManagedVLLMPolicy", "OpenAICompatiblePolicy", "OpenAITeacherResource", "PolicyResource",
    "ScriptedTeacherResource", "StoreResource", "TeacherResource", "TransformersPolicy", "make_policy",
]
