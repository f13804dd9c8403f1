"""The long-range exemplar task and the studies run on it (README.md here): the data generator
(:mod:`.data`), the configs (``configs/``), a mixer's statistics while it trains
(:mod:`.training_stats`, ``MixerStatsHook``), success-rate statistics (:mod:`.success_rates`),
the equal-budget comparison (:mod:`.study`) and the graded claim (:mod:`.graded`). Importing the
package loads nothing: a config imports ``projects.longrange.training_stats`` to register the
hook."""
