"""The workbench: where what every wing knows about a trace meets. The trace list (filters, saved
views, bulk actions), a trace's page (the conversation, tags, feedback pinned to a turn, the
adapters that learnt from each feedback) and the trace API that reads the same. It sits above the
wings it shows (traces, review, learning), so none of them imports it."""
