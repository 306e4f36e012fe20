import dagster as dg

from envs.base import BenchmarkSpec
from flywheel.core.options import Bound
from flywheel.core.store import Store
from flywheel.resources.fields import check_fields, setting
from flywheel.teacher import OpenAITeacher, ScriptedTeacher, Teacher


class TeacherResource(dg.ConfigurableResource):
    """Base: swap teachers by subclass, never by a string switch."""

    def build(self, spec: BenchmarkSpec, store: Store) -> Teacher:
        raise NotImplementedError

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        check_fields(self, where="teacher.")  # each number within its declared bound, at the run's first step


class ScriptedTeacherResource(TeacherResource):
    """Offline default: thoughts from privileged env structure, labelled 'scripted'."""

    lookahead: int = setting(2, help="upcoming actions a thought names", bound=Bound(0, 100))
    grounded_lookahead: bool = setting(True, help="name an upcoming action only once the agent has seen every word "
                                       "of it; false: the earlier teacher, whose thoughts named objects before the "
                                       "agent saw them")

    def build(self, spec: BenchmarkSpec, store: Store) -> Teacher:
        return ScriptedTeacher(spec.describe_action, lookahead=self.lookahead,
                               grounded_lookahead=self.grounded_lookahead)


class OpenAITeacherResource(TeacherResource):
    """Any OpenAI-compatible endpoint; the key comes only from an environment variable."""

    base_url: str = setting(help="the teacher endpoint's URL, e.g. https://api.example.com/v1")
    model: str = setting(help="the teacher model's name at that endpoint")
    api_key: str = setting(dg.EnvVar("FLYWHEEL_TEACHER_API_KEY"), help="the key ($FLYWHEEL_TEACHER_API_KEY)")
    max_retries: int = setting(5, help="retries of a failed teacher request", bound=Bound(0, 100))
    backoff_s: float = setting(1.0, help="first wait between retries, seconds (doubles each retry)",
                               bound=Bound(0, 3_600, integer=False))
    timeout_s: float = setting(120.0, bound=Bound(1, 3600, integer=False), help="seconds one teacher request may "
                               "take in all: connecting, the first byte and the whole answer, and its retries and "
                               "waits between them (a slow or trickling endpoint is cut off there)")

    def build(self, spec: BenchmarkSpec, store: Store) -> Teacher:
        return OpenAITeacher(
            base_url=self.base_url, model=self.model, api_key=self.api_key, cache=store,
            max_retries=self.max_retries, backoff_s=self.backoff_s, timeout_s=self.timeout_s,
        )
