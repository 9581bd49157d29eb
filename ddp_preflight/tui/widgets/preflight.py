"""The preflight report: the results worth a look (all of them on request), and the selected
one's summary, fix and details. What a node said is shown as plain text (never markup), its
control characters written out (node/terminal.py)."""

from __future__ import annotations

import json

from rich.text import Text
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from ddp_preflight.node.terminal import shown, shown_data

from .. import format as fmt

STATUS_STYLE = {"fail": "bold red", "error": "bold red", "warn": "yellow", "skip": "dim", "pass": "green"}


class PreflightPanel(Horizontal):
    DEFAULT_CSS = """
    PreflightPanel { height: 9; border: round $primary; }
    PreflightPanel.-empty { display: none; }
    PreflightPanel > DataTable { width: auto; max-width: 50%; height: 1fr; }
    PreflightPanel > VerticalScroll { width: 1fr; height: 1fr; padding: 0 1; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.show_all = False
        self._report: dict | None = None
        self._rows: list[dict] = []

    def compose(self):
        table = DataTable(cursor_type="row", id="preflight-list")
        table.add_columns("status", "check", "node")
        yield table
        with VerticalScroll(id="preflight-scroll"):
            yield Static(id="preflight-detail")

    def show(self, report: dict | None) -> None:
        if report == self._report:
            return
        self._report = report
        self.set_class(report is None, "-empty")
        self._fill()

    def toggle_all(self) -> None:
        self.show_all = not self.show_all
        self._fill()

    def _fill(self) -> None:
        results = (self._report or {}).get("results", [])
        table = self.query_one("#preflight-list", DataTable)
        chosen = table.cursor_row
        self._rows = fmt.preflight_rows(results, self.show_all)
        table.clear()
        for result in self._rows:
            status = result["status"]
            table.add_row(Text(shown(fmt.STATUS_LABEL.get(status, status)), STATUS_STYLE.get(status, "")),
                          Text(shown(result["check"])), Text(shown(fmt.node_text(result.get("node")))))
        showing = "all" if self.show_all else "problems"
        self.border_title = Text(shown(f"preflight: {fmt.preflight_counts(results)} · showing {showing}"))
        if self._rows:
            table.move_cursor(row=min(chosen, len(self._rows) - 1))
        self._detail(table.cursor_row if self._rows else None)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "preflight-list":
            self._detail(event.cursor_row)

    def _detail(self, index: int | None) -> None:
        detail = self.query_one("#preflight-detail", Static)
        if index is None or not 0 <= index < len(self._rows):
            detail.update("every check passed" if self._report and self._report.get("results") else "")
            return
        detail.update(render_result(self._rows[index]))

    def selected(self) -> dict | None:
        index = self.query_one("#preflight-list", DataTable).cursor_row
        return self._rows[index] if 0 <= index < len(self._rows) else None


def render_result(result: dict) -> Text:
    result = shown_data(result)
    status = result["status"]
    text = Text()
    text.append(f"{fmt.STATUS_LABEL.get(status, status)} ", STATUS_STYLE.get(status, ""))
    text.append(f"{result['check']} on {fmt.node_text(result.get('node'))}\n", "bold")
    text.append(result.get("summary", "") + "\n")
    if result.get("fix"):
        text.append("fix: ", "bold")
        text.append(result["fix"] + "\n")
    for key, value in (result.get("details") or {}).items():
        text.append(f"{key}: ", "dim")
        text.append(shown(value if isinstance(value, str) else json.dumps(value)) + "\n")
    text.rstrip()
    return text
