"""The read side: what a finished (or running) campaign's results look like to a person.

It reads the results store (`labkube.store`, `labkube.report`'s rows) and the formats the write side leaves
behind (transcripts, integrity verdicts, task references) and turns them into the terminal tables
(`views`), the HTML report and trajectory viewer (`html_report`, `trajectory_view`, `templates/`), pass@k
(`passk`), `labkube analyze` (`analysis*`) and `labkube export` (`export*`). Nothing here writes a run, and
nothing on the write side (agent, tasks, integrity, operator) imports it; tests/test_architecture.py holds
both to that.
"""
