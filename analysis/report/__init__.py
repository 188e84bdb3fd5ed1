"""Drawing reports from summaries and run directories: the terminal renderings (render), the
self-contained HTML report (html, parts, charts, palette), the path diagram (path_model, svg_path) and the
transaction waterfalls. Imports analysis core modules; nothing of the agent."""
