"""Teachers turn expert trajectories into planning quaternions (stage 1)."""

from flywheel.teacher.base import Annotation, Teacher, TeacherError
from flywheel.teacher.openai_teacher import OpenAITeacher
from flywheel.teacher.scripted import ScriptedTeacher

__all__ = ["Annotation", "Teacher", "TeacherError", "OpenAITeacher", "ScriptedTeacher"]
