"""Alembic's entry point: always run by ``shellbox.store.migrate`` on a connection it opened."""

from alembic import context

from shellbox.store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
