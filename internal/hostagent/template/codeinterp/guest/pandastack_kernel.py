"""What PandaStack's code server loads into each Python kernel (IPython).

setup() is run once per kernel, before the kernel's first cell: it imports
the data stack warm (numpy, pandas, matplotlib with the inline backend, so
figures are shown as PNG), turns colours off and registers two display
formatters under PandaStack's own MIME types, which the server turns into
E2B's result keys:

  CHART_MIME  a matplotlib Figure as an E2B chart (line, scatter, bar, pie,
              box_and_whisker, superchart or unknown)
  DATA_MIME   a pandas DataFrame as DataFrame.to_dict(orient="list")

set_env() and restore_env() apply a cell's env_vars around it.

Everything here runs in the user's interpreter: it must never raise into a
cell, and it keeps its names out of the user's namespace.
"""

import datetime
import json
import math
import numbers
import os

CHART_MIME = "application/vnd.pandastack.chart+json"
DATA_MIME = "application/vnd.pandastack.data+json"

# Bounds on what a formatter extracts: a chart of more points, or a data
# frame of more cells, is shown by its other representations only (a PNG,
# HTML) rather than as a multi-megabyte JSON document.
MAX_CHART_POINTS = 100_000
MAX_DATA_CELLS = 100_000

_saved_env = {}


def set_env(env_json):
    """Sets the variables of the JSON object env_json in os.environ,
    remembering what they were for restore_env."""
    global _saved_env
    env = json.loads(env_json)
    _saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)


def restore_env():
    """Puts back the variables set_env changed."""
    global _saved_env
    for k, v in _saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _saved_env = {}


# A kernel's stdout and stderr are sent every 0.2 s (ipykernel's
# OutStream.flush_interval): a loop that writes faster keeps everything
# it wrote meanwhile in memory, and 100 MB written without a flush took a
# kernel of a 512 MiB sandbox past its memory. Past this many characters
# buffered, a write flushes (and waits for the send) first.
MAX_STREAM_BUFFER = 1 << 20


def _bound_stream_buffers():
    """Makes ipykernel's output streams flush once MAX_STREAM_BUFFER
    characters wait, so that fast output costs a bounded buffer."""
    try:
        from ipykernel.iostream import OutStream
    except ImportError:
        return
    write = OutStream.write
    if getattr(write, "_pandastack_bounded", False):
        return

    def bounded_write(self, string):
        n = write(self, string)
        try:
            if self._buffer.tell() > MAX_STREAM_BUFFER and self._is_master_process():
                self.flush()
        except Exception:
            pass  # never into the cell: the periodic flush still runs
        return n

    bounded_write._pandastack_bounded = True
    OutStream.write = bounded_write


def setup(ip):
    """Prepares the IPython shell ip: warm imports, inline PNG figures,
    no colours, the chart and data formatters."""
    import numpy  # noqa: F401  (warm: cached in sys.modules)
    import pandas
    import matplotlib

    matplotlib.use("module://matplotlib_inline.backend_inline")
    import matplotlib.pyplot  # noqa: F401
    import matplotlib.figure
    import matplotlib.axes

    ip.run_line_magic("colors", "nocolor")
    try:
        ip.run_line_magic("config", "InlineBackend.figure_formats = {'png'}")
    except Exception:
        pass

    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class ChartFormatter(BaseFormatter):
        format_type = Unicode(CHART_MIME)
        _return_type = (dict,)
        print_method = ObjectName("_repr_pandastack_chart_")

    class DataFormatter(BaseFormatter):
        format_type = Unicode(DATA_MIME)
        _return_type = (dict,)
        print_method = ObjectName("_repr_pandastack_data_")

    df = ip.display_formatter
    chart = ChartFormatter(parent=df)
    # A method rather than chart.for_type(Figure): the inline backend
    # removes Figure from every formatter's type printers whenever it
    # (re)configures itself (IPython's select_figure_formats).
    safe_chart = _safe(chart_of_figure)
    matplotlib.figure.Figure._repr_pandastack_chart_ = lambda self: safe_chart(self)
    data = DataFormatter(parent=df)
    data.for_type(pandas.DataFrame, _safe(data_of_frame))
    df.formatters[CHART_MIME] = chart
    df.formatters[DATA_MIME] = data

    _record_boxplots(matplotlib.axes.Axes)
    _bound_stream_buffers()


def _safe(fn):
    """fn, returning None instead of raising: a formatter that fails shows
    nothing rather than a traceback in the user's cell."""

    def wrapped(obj):
        try:
            return fn(obj)
        except Exception:
            return None

    return wrapped


def _record_boxplots(Axes):
    """Wraps Axes.boxplot so that the axes remember the artists of their
    box plots: drawn with lines only, a box plot cannot be told from a line
    chart afterwards."""
    if getattr(Axes.boxplot, "_pandastack", False):
        return
    original = Axes.boxplot

    def boxplot(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            vert = kwargs.get("vert", True)
            if vert is None:
                vert = True
            self.__dict__.setdefault("_pandastack_boxplots", []).append((result, bool(vert)))
        except Exception:
            pass
        return result

    boxplot._pandastack = True
    boxplot.__doc__ = original.__doc__
    boxplot.__wrapped__ = original
    Axes.boxplot = boxplot


# --- data frames -----------------------------------------------------------


def data_of_frame(frame):
    """frame.to_dict(orient="list") with JSON values, or None for a frame
    of more than MAX_DATA_CELLS cells."""
    rows, cols = frame.shape
    if rows * cols > MAX_DATA_CELLS:
        return None
    out = {}
    for k, values in frame.to_dict(orient="list").items():
        out[_key(k)] = [_json_value(v) for v in values]
    return out


def _key(k):
    if isinstance(k, str):
        return k
    if isinstance(k, tuple):
        return " ".join(str(p) for p in k)
    return str(k)


def _json_value(v):
    """v as a JSON value: numbers (NaN and infinities as null), strings,
    booleans, null; dates as ISO 8601; anything else as its str."""
    import numpy

    if v is None or isinstance(v, (str, bool)):
        return v
    if isinstance(v, numpy.bool_):
        return bool(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, (datetime.date, datetime.time)):
        try:
            import pandas

            if v is pandas.NaT:
                return None
        except Exception:
            pass
        return v.isoformat()
    if isinstance(v, numpy.datetime64):
        if numpy.isnat(v):
            return None
        import pandas

        return pandas.Timestamp(v).isoformat()
    if isinstance(v, numpy.generic):
        return _json_value(v.item())
    try:
        import pandas

        if v is pandas.NA or v is pandas.NaT:
            return None
    except Exception:
        pass
    return str(v)


# --- charts ----------------------------------------------------------------


def chart_of_figure(fig):
    """fig as an E2B chart: one axes is one chart, several a superchart of
    one per axes; None for a figure without axes or of too many points."""
    axes = [ax for ax in fig.get_axes() if not _is_colorbar(ax)]
    if not axes:
        return None
    budget = [MAX_CHART_POINTS]
    if len(axes) == 1:
        chart = chart_of_axes(axes[0], budget)
    else:
        suptitle = getattr(fig, "_suptitle", None)
        chart = {
            "type": "superchart",
            "title": suptitle.get_text() if suptitle is not None else "",
            "elements": [chart_of_axes(ax, budget) for ax in axes],
        }
    if budget[0] < 0:
        return None
    return chart


def _is_colorbar(ax):
    return getattr(ax, "_colorbar", None) is not None or ax.get_label() == "<colorbar>"


def _kind(ax):
    """The chart type ax draws: what its artists are."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Rectangle, Wedge

    if ax.__dict__.get("_pandastack_boxplots"):
        return "box_and_whisker"
    patches = list(ax.patches)
    lines = list(ax.lines)
    collections = list(ax.collections)
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if patches and all(isinstance(p, Wedge) for p in patches) and not lines and not collections:
        return "pie"
    if bars and all(isinstance(p, Rectangle) for p in patches) and not collections:
        return "bar"
    if collections and all(isinstance(c, PathCollection) for c in collections) and not lines and not patches:
        return "scatter"
    if lines and not collections and not patches:
        return "line"
    return "unknown"


def chart_of_axes(ax, budget):
    """One axes as an E2B chart; budget[0] is decreased by the points it
    holds."""
    kind = _kind(ax)
    chart = {"type": kind, "title": ax.get_title(), "elements": []}
    if kind == "pie":
        chart["elements"] = _pie(ax)
        return chart
    _axis_labels(ax, chart, swap=kind == "bar" and _horizontal_bars(ax))
    if kind in ("line", "scatter"):
        chart.update(_ticks(ax))
        chart["elements"] = _lines(ax, budget) if kind == "line" else _scatters(ax, budget)
    elif kind == "bar":
        chart["elements"] = _bars(ax, budget)
    elif kind == "box_and_whisker":
        chart["elements"] = _boxes(ax, budget)
    return chart


def _axis_labels(ax, chart, swap=False):
    x, y = ax.get_xlabel(), ax.get_ylabel()
    if swap:
        x, y = y, x
    chart["x_label"] = x
    chart["y_label"] = y
    for key, label in (("x_unit", x), ("y_unit", y)):
        unit = _unit(label)
        if unit is not None:
            chart[key] = unit


def _unit(label):
    """The unit of an axis label written "Name (unit)" or "Name [unit]"."""
    label = label.strip()
    for open_, close in (("(", ")"), ("[", "]")):
        if label.endswith(close) and open_ in label:
            unit = label[label.rindex(open_) + 1 : -1].strip()
            if unit:
                return unit
    return None


def _converter(axis):
    get = getattr(axis, "get_converter", None)
    return get() if get is not None else getattr(axis, "converter", None)


def _scale(axis, scale):
    conv = _converter(axis)
    module = type(conv).__module__ if conv is not None else ""
    if module == "matplotlib.dates":
        return "datetime"
    if module == "matplotlib.category":
        return "categorical"
    return scale


def _ticks(ax):
    out = {}
    for name, axis, scale, ticks, labels in (
        ("x", ax.xaxis, ax.get_xscale(), ax.get_xticks(), ax.get_xticklabels()),
        ("y", ax.yaxis, ax.get_yscale(), ax.get_yticks(), ax.get_yticklabels()),
    ):
        kind = _scale(axis, scale)
        if kind == "datetime":
            import matplotlib.dates

            values = [matplotlib.dates.num2date(t).isoformat() for t in ticks]
        else:
            values = [_json_value(t) for t in ticks]
        out[name + "_ticks"] = values
        out[name + "_scale"] = kind
        out[name + "_tick_labels"] = [t.get_text() for t in labels]
    return out


def _label(artist, fallback):
    label = artist.get_label()
    if not isinstance(label, str) or not label or label.startswith("_"):
        return fallback
    return label


def _spend(budget, n):
    budget[0] -= n
    return budget[0] >= 0


def _lines(ax, budget):
    out = []
    for i, line in enumerate(ax.lines):
        xs, ys = line.get_xdata(orig=True), line.get_ydata(orig=True)
        n = min(len(xs), len(ys))
        if not _spend(budget, n):
            return []
        out.append({"label": _label(line, "Line %d" % i), "points": [[_json_value(xs[j]), _json_value(ys[j])] for j in range(n)]})
    return out


def _scatters(ax, budget):
    out = []
    for i, coll in enumerate(ax.collections):
        offsets = coll.get_offsets()
        if not _spend(budget, len(offsets)):
            return []
        out.append({"label": _label(coll, "Series %d" % i), "points": [[_json_value(p[0]), _json_value(p[1])] for p in offsets]})
    return out


def _horizontal_bars(ax):
    from matplotlib.container import BarContainer

    for c in ax.containers:
        if isinstance(c, BarContainer):
            return getattr(c, "orientation", None) == "horizontal"
    return False


def _tick_label(ticks, labels, at):
    """The text of the tick at position at, or at itself formatted."""
    for t, l in zip(ticks, labels):
        if abs(float(t) - at) < 1e-9 * max(1.0, abs(at)):
            text = l.get_text()
            if text:
                return text
    return "%g" % at


def _bars(ax, budget):
    from matplotlib.container import BarContainer

    horizontal = _horizontal_bars(ax)
    axis_ticks = ax.get_yticks() if horizontal else ax.get_xticks()
    axis_labels = ax.get_yticklabels() if horizontal else ax.get_xticklabels()
    out = []
    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    for i, c in enumerate(containers):
        group = _label(c, "Group %d" % i)
        if not _spend(budget, len(c.patches)):
            return []
        values = getattr(c, "datavalues", None)
        for j, rect in enumerate(c.patches):
            if horizontal:
                at, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                at, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            if values is not None and j < len(values):
                value = values[j]
            out.append({"label": _tick_label(axis_ticks, axis_labels, at), "group": group, "value": _json_value(value)})
    return out


def _pie(ax):
    from matplotlib.patches import Wedge

    out = []
    for i, w in enumerate(p for p in ax.patches if isinstance(p, Wedge)):
        out.append({"label": _label(w, "Slice %d" % i), "angle": _json_value(w.theta2 - w.theta1), "radius": _json_value(w.r)})
    return out


def _boxes(ax, budget):
    out = []
    for result, vert in ax.__dict__.get("_pandastack_boxplots", []):
        whiskers = result.get("whiskers", [])
        medians = result.get("medians", [])
        fliers = result.get("fliers", [])
        ticks = ax.get_xticks() if vert else ax.get_yticks()
        labels = ax.get_xticklabels() if vert else ax.get_yticklabels()
        for i, median in enumerate(medians):
            if 2 * i + 1 >= len(whiskers):
                break

            def values(line):
                return line.get_ydata() if vert else line.get_xdata()

            def across(line):
                return line.get_xdata() if vert else line.get_ydata()

            low, high = values(whiskers[2 * i]), values(whiskers[2 * i + 1])
            m = values(median)
            pos = across(median)
            at = (float(min(pos)) + float(max(pos))) / 2 if len(pos) else float(i + 1)
            outliers = [_json_value(v) for v in values(fliers[i])] if i < len(fliers) else []
            if not _spend(budget, len(outliers) + 5):
                return []
            out.append(
                {
                    "label": _tick_label(ticks, labels, at),
                    "min": _json_value(min(low)),
                    "first_quartile": _json_value(low[0]),
                    "median": _json_value(m[0]) if len(m) else None,
                    "third_quartile": _json_value(high[0]),
                    "max": _json_value(max(high)),
                    "outliers": outliers,
                }
            )
    return out
