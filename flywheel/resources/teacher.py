import dagster as dg

from envs.base import BenchmarkSpec
from flywheel.core.store import Store
from flywheel.teacher import OpenAITeacher, ScriptedTeacher, Teacher


class TeacherResource(dg.ConfigurableResource):
    """Base: swap teachers by subclass, never by a string switch."""

    def build(self, spec: BenchmarkSpec, store: Store) -> Teacher:
        raise NotImplementedError


class ScriptedTeacherResource(TeacherResource):
    """Offline default: thoughts from privileged env structure, labelled 'scripted'."""

    lookahead: int = 2
    # Name an upcoming action only once the agent has seen every word of it (flywheel.teacher.scripted);
    # false reproduces the earlier teacher, whose thoughts named objects before the agent saw them.
    grounded_lookahead: bool = True

    def build(self, spec: BenchmarkSpec, store: Store) -> Teacher:
        return ScriptedTeacher(spec.describe_action, lookahead=self.lookahead,
                               grounded_lookahead=self.grounded_lookahead)


class OpenAITeacherResource(TeacherResource):
    """Any OpenAI-compatible endpoint; the key comes only from an environment variable."""

    base_url: str
    model: str
    api_key: str = dg.EnvVar("FLYWHEEL_TEACHER_API_KEY")
    max_retries: int = 5
    backoff_s: float = 1.0
    timeout_s: float = 120.0

    def build(self, spec: BenchmarkSpec, store: Store) -> Teacher:
        return OpenAITeacher(
            base_url=self.base_url, model=self.model, api_key=self.api_key, cache=store,
            max_retries=self.max_retries, backoff_s=self.backoff_s, timeout_s=self.timeout_s,
        )
