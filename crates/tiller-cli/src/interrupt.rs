//! Ctrl-C as a stream of interrupts, so a command decides what each one means.

/// Interrupts (SIGINT) received from now on; from the moment it is made, Ctrl-C no
/// longer ends the process by itself.
#[derive(Debug)]
pub struct Interrupts {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Interrupts {
    /// Starts listening.
    pub fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Interrupts {
                signal: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Interrupts {}
    }

    /// The next interrupt.
    pub async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = &mut self.signal
            && signal.recv().await.is_some()
        {
            return;
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_ok() {
            return;
        }
        std::future::pending::<()>().await;
    }
}
