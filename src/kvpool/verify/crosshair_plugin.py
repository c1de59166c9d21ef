"""CrossHair plugin: registers the bounded ``PoolState`` creator. Pass with ``--extra_plugin``.

CrossHair ``exec``s this file's text inside a function, so it only imports and calls.
"""

from kvpool.verify import crosshair_states

crosshair_states.register()
