"""The code sandbox's launcher: run as ``python -I -S sandbox_launcher.py`` by
:func:`rollart.runtime.envs.code_exec.run_solution` (standard library only, no rollart import:
it must work without ``site``).

Process tree, each step a fresh process:

1. **launcher** (root, in the caller's namespaces): ``PR_SET_PDEATHSIG`` (dies with the
   caller), ``unshare`` of new network, mount, PID, IPC and UTS namespaces, then ``fork``.
2. **init** (root, PID 1 of the new PID namespace): dies with the launcher; makes every mount
   private, remounts ``/`` read-only, mounts a fresh ``/proc`` (only this namespace's
   processes: the caller's ``/proc/PID/environ`` is not there), small ``tmpfs`` over ``/tmp``,
   ``/var/tmp`` and ``/dev/shm`` (the only writable place is ``/tmp/work``, owned by the
   sandbox user), binds the Python installation read-only at ``/tmp/.python``; then ``fork``.
3. **runner** (the sandbox user, an unprivileged uid/gid with no groups, ``no_new_privs``,
   rlimits on CPU, address space, file size, processes, open files, no core dumps, cwd
   ``/tmp/work``): ``exec``s Python on :data:`RUNNER`, which reads the candidate code and the
   test *inputs* (never the expected outputs) from stdin and writes the return values as JSON
   to fd 3. The caller compares them with the expected values it kept to itself.

When the runner exits, init exits, and the kernel kills every process left in the namespace
(children that ``setsid``/double-forked included). The network namespace has only a loopback
interface that is down: no TCP/UDP anywhere, no abstract Unix sockets of the host.

Exit status of the launcher: the runner's exit code, 128 + signal if a signal killed it, or
:data:`UNAVAILABLE` (with the reason on stderr) when the namespaces cannot be made.
"""

import ctypes
import json
import os
import resource
import signal
import sys

UNAVAILABLE = 97

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

RUNNER = r'''
import json, os, sys
payload = json.loads(sys.stdin.read())
sys.stdin.close()
out = os.fdopen(3, "w")
results = []
ns = {"__name__": "solution"}
try:
    exec(compile(payload["code"], "solution.py", "exec"), ns)
    fn = ns.get(payload["func"])
    if not callable(fn):
        raise NameError("the code does not define a function named " + payload["func"])
except BaseException as e:
    out.write(json.dumps({"error": type(e).__name__ + ": " + str(e)[:300]}))
    out.close()
    raise
for args in payload["args"]:
    try:
        value = fn(*args)
        json.dumps(value)
        results.append({"ok": True, "value": value})
    except Exception as e:
        results.append({"ok": False, "error": type(e).__name__ + ": " + str(e)[:200]})
out.write(json.dumps({"results": results}))
out.close()
'''

_libc = ctypes.CDLL(None, use_errno=True)


def _call(name, *args):
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None):
    _call("mount", src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
          ctypes.c_ulong(flags), data.encode() if data else None)


def _die_with_parent(parent):
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _wait_status(pid):
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _init(cfg, launcher):
    """PID 1 of the sandbox's PID namespace (root inside it)."""
    _die_with_parent(0)  # the launcher is outside this PID namespace: getppid() reads 0
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for d in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=0555")
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmp_kb']}k,mode=0755")
    os.mkdir("/tmp/.python", 0o755)
    _mount(cfg["python_prefix"], "/tmp/.python", None, MS_BIND | MS_REC)
    _mount(None, "/tmp/.python", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    os.mkdir("/tmp/work", 0o700)
    os.chown("/tmp/work", cfg["uid"], cfg["gid"])
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _runner(cfg, me)
        finally:
            os._exit(111)
    rc = _wait_status(pid)
    os._exit(rc)  # PID 1 exits: the kernel kills whatever the runner left behind


def _runner(cfg, init_pid):
    _die_with_parent(init_pid)
    os.chdir("/tmp/work")
    limits = [(resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1), (resource.RLIMIT_AS, cfg["memory"], cfg["memory"]),
              (resource.RLIMIT_FSIZE, cfg["fsize"], cfg["fsize"]), (resource.RLIMIT_NPROC, cfg["nproc"], cfg["nproc"]),
              (resource.RLIMIT_NOFILE, 64, 64), (resource.RLIMIT_CORE, 0, 0)]
    os.setgroups([])
    os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
    os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for res, soft, hard in limits:  # after setuid: RLIMIT_NPROC counts the sandbox user's processes
        resource.setrlimit(res, (soft, hard))
    if cfg["result_fd"] != 3:
        os.dup2(cfg["result_fd"], 3)
        os.close(cfg["result_fd"])
    python = "/tmp/.python/" + cfg["python_rel"]
    # the interpreter may find libpython through an absolute RPATH the sandbox user cannot read
    os.execve(python, [python, "-I", "-S", "-c", RUNNER],
              {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/tmp/work", "TMPDIR": "/tmp/work",
               "LD_LIBRARY_PATH": "/tmp/.python/lib"})


def main():
    cfg = json.loads(sys.argv[1])
    _die_with_parent(cfg["caller"])
    try:
        _call("unshare", CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)
    except OSError as exc:
        sys.stderr.write(f"cannot create the sandbox's namespaces ({exc}); the code sandbox needs root "
                         f"(CAP_SYS_ADMIN, CAP_SETUID) on Linux\n")
        os._exit(UNAVAILABLE)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _init(cfg, me)
        except BaseException as exc:  # noqa: BLE001 - report why the sandbox could not be set up
            sys.stderr.write(f"cannot set up the sandbox ({type(exc).__name__}: {exc})\n")
            os._exit(UNAVAILABLE)
        os._exit(111)
    os._exit(_wait_status(pid))


if __name__ == "__main__":
    main()
