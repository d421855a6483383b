"""Follow the teacher: a leader's page publishes its state to a room, students' pages follow it.

- `rooms`: codes, versioned published links, expiry, one leading page (plain Python);
- `store`: the key-value store behind the rooms (in memory, or Redis for several servers);
- `sync`: the process's background thread that makes every store call off the pages' runs;
- `push`: a leader's move asks this server's following pages to run at once;
- `turns`: ... which then draw the teacher's step one at a time;
- `room_link`, `leader`, `follower`: the Streamlit side of each (the leader's panel and heartbeat; the follower's
  banner, poll and checks), wired into the page by `page`.
"""
