"""Dagster resources: thin typed wrappers that build the plain core objects."""

from flywheel.resources.curriculum_resource import CurriculumResource
from flywheel.resources.envs import EnvResource
from flywheel.resources.loop import LoopResource
from flywheel.resources.method import MethodResource
from flywheel.resources.policy import (
    ManagedVLLMPolicy,
    OpenAICompatiblePolicy,
    PolicyResource,
    TransformersPolicy,
    make_policy,
)
from flywheel.resources.store_resource import StoreResource
from flywheel.resources.teacher import OpenAITeacherResource, ScriptedTeacherResource, TeacherResource

__all__ = [
    "CurriculumResource", "EnvResource", "LoopResource", "ManagedVLLMPolicy", "MethodResource", "OpenAICompatiblePolicy", "OpenAITeacherResource", "PolicyResource",
    "ScriptedTeacherResource", "StoreResource", "TeacherResource", "TransformersPolicy", "make_policy",
]
