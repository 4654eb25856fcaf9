//! Server processes: spawned so that they die with the process that started them, logged to a file, and
//! killed when their handle is dropped.
//!
//! Linux delivers `PR_SET_PDEATHSIG` when the *thread* that forked the child exits, not the process. Tests
//! run on short-lived runtime threads, so every server is forked by one spawner thread that lives as long
//! as the process: servers then outlive any single test but never the test binary, even one killed with
//! SIGKILL or aborted by a panic.

use std::fs::File;
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::error::{io_error, TestEnvError};
use crate::wait::{poll_until, Check};

/// How many times a server is started on fresh ports when it dies during start-up (another process may
/// have taken a port between [`crate::net::free_port`] and the bind).
const START_ATTEMPTS: usize = 3;

type SpawnReply = mpsc::Sender<std::io::Result<Child>>;

fn spawner() -> &'static Mutex<mpsc::Sender<(Command, SpawnReply)>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<(Command, SpawnReply)>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<(Command, SpawnReply)>();
        std::thread::Builder::new()
            .name("pko-testenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    // The requester may have given up; nothing to report then.
                    let _ = reply.send(command.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(
                |error| tracing::error!(%error, "cannot start the process spawner thread"),
            );
        Mutex::new(requests)
    })
}

fn spawn_from_spawner(mut command: Command) -> std::io::Result<Child> {
    die_with_parent(&mut command);
    let (reply, response) = mpsc::channel();
    {
        let requests = spawner()
            .lock()
            .map_err(|_| std::io::Error::other("process spawner lock poisoned"))?;
        requests
            .send((command, reply))
            .map_err(|_| std::io::Error::other("process spawner thread is gone"))?;
    }
    response
        .recv()
        .map_err(|_| std::io::Error::other("process spawner thread is gone"))?
}

#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe syscalls
    // (prctl, getppid, setpgid, _exit).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            // Own process group: a Ctrl-C in the launcher's terminal reaches the launcher, which then
            // stops the servers in order, instead of every server at once.
            libc::setpgid(0, 0);
            Ok(())
        });
    }
}

/// A running server.
#[derive(Debug)]
pub(crate) struct ManagedProcess {
    name: String,
    child: Mutex<Child>,
    log: PathBuf,
}

impl ManagedProcess {
    /// Starts `command` with stdout and stderr appended to `log`.
    pub(crate) fn spawn(
        name: &str,
        mut command: Command,
        log: &Path,
    ) -> Result<Self, TestEnvError> {
        let out = File::create(log).map_err(io_error("create log", log))?;
        let err = out.try_clone().map_err(io_error("open log", log))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = spawn_from_spawner(command).map_err(|source| TestEnvError::Spawn {
            name: name.to_owned(),
            source,
        })?;
        tracing::debug!(name, pid = child.id(), log = %log.display(), "started");
        Ok(Self {
            name: name.to_owned(),
            child: Mutex::new(child),
            log: log.to_owned(),
        })
    }

    /// Stops the process if it runs and starts `command` in its place, appending to the same log (a
    /// server restarted on its old port and data).
    pub(crate) fn respawn(&self, mut command: Command) -> Result<(), TestEnvError> {
        self.stop();
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .map_err(io_error("open log", &self.log))?;
        let err = out.try_clone().map_err(io_error("open log", &self.log))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = spawn_from_spawner(command).map_err(|source| TestEnvError::Spawn {
            name: self.name.clone(),
            source,
        })?;
        if let Ok(mut slot) = self.child.lock() {
            *slot = child;
        }
        Ok(())
    }

    /// Process id.
    #[cfg(feature = "cluster")]
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.lock().ok().map(|child| child.id())
    }

    /// Path of the log file.
    #[cfg(feature = "cluster")]
    pub(crate) fn log_path(&self) -> &Path {
        &self.log
    }

    /// An error if the process has exited.
    pub(crate) fn check_running(&self) -> Result<(), TestEnvError> {
        let status = match self.child.lock() {
            Ok(mut child) => child.try_wait().ok().flatten(),
            Err(_) => None,
        };
        match status {
            None => Ok(()),
            Some(status) => Err(TestEnvError::Exited {
                name: self.name.clone(),
                status: status.to_string(),
                log_tail: self.log_tail(),
            }),
        }
    }

    /// Waits until the process exits by itself and returns how it ended.
    #[cfg(feature = "cluster")]
    pub(crate) async fn wait_exit(
        &self,
        timeout: Duration,
    ) -> Result<std::process::ExitStatus, TestEnvError> {
        let result = crate::wait::wait_until(&format!("{} exits", self.name), timeout, || async {
            match self.child.lock() {
                Ok(mut child) => match child.try_wait() {
                    Ok(Some(status)) => Ok(status),
                    Ok(None) => Err("still running".to_owned()),
                    Err(e) => Err(e.to_string()),
                },
                Err(_) => Err("process handle poisoned".to_owned()),
            }
        })
        .await;
        result.map_err(|error| match error {
            TestEnvError::NotReady {
                what,
                after,
                last_error,
                ..
            } => TestEnvError::NotReady {
                what,
                after,
                last_error,
                log_tail: Some(self.log_tail()),
            },
            other => other,
        })
    }

    /// Sends `signal` (as `kill` spells it: `-STOP`, `-TERM`, …) to the process.
    #[cfg(feature = "cluster")]
    pub(crate) fn signal(&self, signal: &str) -> Result<(), TestEnvError> {
        signal_process(&self.name, self.pid().unwrap_or_default(), signal, || {
            self.log_tail()
        })
    }

    /// Asks the process to stop (SIGTERM) as a kubelet does, and waits up to `grace` for it to exit; kills
    /// it after that. Returns how it ended.
    #[cfg(feature = "cluster")]
    pub(crate) async fn terminate(
        &self,
        grace: Duration,
    ) -> Result<std::process::ExitStatus, TestEnvError> {
        let sent = self.signal("-TERM");
        let ended = self.wait_exit(grace).await;
        if sent.is_err() || ended.is_err() {
            self.stop();
        }
        ended
    }

    /// Waits until `check` passes, failing at once if the process exits and with its log tail on timeout.
    pub(crate) async fn wait_ready<F, Fut>(
        &self,
        timeout: Duration,
        mut check: F,
    ) -> Result<(), TestEnvError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let result = poll_until(&self.name, timeout, || {
            let alive = self.check_running();
            let attempt = check();
            async move {
                if let Err(error) = alive {
                    return Check::Failed(error);
                }
                match attempt.await {
                    Ok(()) => Check::Ready(()),
                    Err(reason) => Check::Pending(reason),
                }
            }
        })
        .await;
        match result {
            Err(TestEnvError::NotReady {
                what,
                after,
                last_error,
                ..
            }) => Err(TestEnvError::NotReady {
                what,
                after,
                last_error,
                log_tail: Some(self.log_tail()),
            }),
            other => other,
        }
    }

    /// The last lines of the log.
    pub(crate) fn log_tail(&self) -> String {
        const TAIL_BYTES: u64 = 4096;
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            let length = file.metadata().map(|meta| meta.len()).unwrap_or(0);
            let _ = file.seek(SeekFrom::Start(length.saturating_sub(TAIL_BYTES)));
            let mut bytes = Vec::new();
            let _ = file.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kills the process and reaps it; does nothing if it already exited.
    pub(crate) fn stop(&self) {
        if let Ok(mut child) = self.child.lock() {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
                tracing::debug!(name = %self.name, "stopped");
            }
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `start` until it succeeds, again on new ports when the server died during start-up.
pub(crate) async fn start_with_retries<T, F, Fut>(mut start: F) -> Result<T, TestEnvError>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, TestEnvError>>,
{
    let mut attempt = 1;
    loop {
        match start(attempt).await {
            Err(TestEnvError::Exited {
                name,
                status,
                log_tail,
            }) if attempt < START_ATTEMPTS => {
                tracing::warn!(%name, %status, attempt, "server exited during start-up, retrying on new ports: {log_tail}");
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Sends `signal` (`-STOP`, `-KILL`, ...) to process `pid`, which `name` names in errors.
#[cfg(feature = "cluster")]
pub(crate) fn signal_process(
    name: &str,
    pid: u32,
    signal: &str,
    log_tail: impl FnOnce() -> String,
) -> Result<(), TestEnvError> {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .map_err(crate::error::io_error("run kill", Path::new("kill")))?;
    if status.success() {
        Ok(())
    } else {
        Err(TestEnvError::Exited {
            name: format!("{name} (kill {signal} {pid})"),
            status: status.to_string(),
            log_tail: log_tail(),
        })
    }
}
