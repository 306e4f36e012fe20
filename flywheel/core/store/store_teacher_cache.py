"""The teacher's answers, cached by request key."""

from __future__ import annotations

from flywheel.core.store.store_connection import StoreConnection, encodable, utc_now


class TeacherCacheTables(StoreConnection):
    """The teacher cache."""

    def cache_get(self, key: str) -> str | None:
        df = self.query("SELECT response FROM teacher_cache WHERE key = ?", [key])
        return None if df.is_empty() else df["response"][0]

    def cache_put(self, key: str, model: str, response: str) -> None:
        with self.transaction() as con:
            con.execute("DELETE FROM teacher_cache WHERE key = ?", [key])
            con.execute("INSERT INTO teacher_cache VALUES (?, ?, ?, ?)", [key, model, encodable(response), utc_now()])

    def teacher_models(self) -> list[str]:
        """The models whose answers the teacher cache holds (none for a scripted teacher)."""
        df = self.query("SELECT DISTINCT model FROM teacher_cache WHERE model IS NOT NULL ORDER BY 1")
        return df["model"].to_list()
