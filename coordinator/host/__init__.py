"""The execution host: the loop around the fold, its journals, projections, leadership,
replica, store server, compaction and replay."""
