"""nbgrader internals the engine uses, written against nbgrader 0.9.6 (pinned in
requirements.txt).

Two nbgrader classes are extended at a private method, each turned here into a public one:

- ``SaveAutoGrades._add_score`` (the score of one graded cell): :class:`SaveAutoGradesBase`
  calls ``add_score``;
- ``ExchangeCollect._path_to_record`` (a collected file's student, assignment and time) and
  ``_sort_by_timestamp``: :class:`ExchangeCollectBase` calls ``path_to_record`` and offers
  ``sort_by_timestamp``.
"""
from __future__ import annotations

from nbgrader.exchange.default import ExchangeCollect
from nbgrader.preprocessors import SaveAutoGrades

__all__ = ["ExchangeCollectBase", "SaveAutoGradesBase"]


class SaveAutoGradesBase(SaveAutoGrades):

    def _add_score(self, cell, resources):
        return self.add_score(cell, resources)

    def add_score(self, cell, resources):
        """nbgrader's own scoring of one graded cell."""
        return SaveAutoGrades._add_score(self, cell, resources)


class ExchangeCollectBase(ExchangeCollect):

    def _path_to_record(self, path):
        return self.path_to_record(path)

    def path_to_record(self, path) -> dict:
        """nbgrader's record of one collected submission (username, filename, timestamp)."""
        return ExchangeCollect._path_to_record(self, path)

    def sort_by_timestamp(self, records) -> list:
        """The records, newest first."""
        return self._sort_by_timestamp(records)
