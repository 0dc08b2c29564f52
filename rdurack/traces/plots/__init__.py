"""Pictures of a job, of the paper study and of a serving study, drawn with matplotlib
(`rdu plot`, `rdu bench paper --plot`, `rdu predict serve --plot`) from what
traces/plotdata/ derives.

- canvas.py: a figure saved as a PNG through the Agg canvas.
- timeline.py: `plot_timeline`, a Gantt chart of the sockets' emulated timeline.
- memory.py: `plot_memory`, memory per tier over emulated time.
- training.py: `plot_loss`, the loss curve; `plot_stages`, peak memory and test
  accuracy per training stage.
- paper.py: `plot_paper`, published against predicted for every figure of the study.
- serving.py: `plot_rates`, a serving study's latencies against the request rate, and
  `read_curves`, what such a PNG was drawn from.

Drawing uses matplotlib's object API on an Agg canvas: no pyplot, no global figure
state, no display needed.
"""
