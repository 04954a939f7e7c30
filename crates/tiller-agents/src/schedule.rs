//! Agents started on a schedule: a trigger of an agent file with `every` or
//! `cron` in place of `on` fires on its own, and [`Schedules`] delivers each
//! fire as the event `schedule.NAME.N` (the agent's name, the trigger's place
//! in its list), which the trigger answers as any trigger answers its event
//! (its `session`, `debounce_ms`; a busy agent gets it as a follow-up).
//!
//! ```yaml
//! json_schema_extra:
//!   kind: agent
//!   name: digest
//!   triggers:
//!     - {every: 15m}                                          # slots from the Unix epoch
//!     - {cron: "0 9 * * 1-5", timezone: Europe/Oslo, session: morning}
//! ```
//!
//! `every` is a number and a unit (`ms`, `s`, `m`, `h`, `d`), from
//! [`MIN_EVERY`] to [`MAX_EVERY`]; its slots are whole multiples of it since the
//! Unix epoch (UTC). `cron` is a cron expression of five fields (or six, seconds
//! first), read in `timezone` (an IANA name; UTC when absent), so `0 9 * * *` is
//! nine o'clock there, summer and winter. The event's payload names the
//! schedule and the slot's time: `{"schedule": "cron 0 9 * * 1-5 Europe/Oslo",
//! "slot": "2026-11-30T09:00:00+01:00[Europe/Oslo]"}`.
//!
//! **At most one fire per slot.** Before a slot fires, it is claimed in the
//! session store ([`SessionStore::claim_slot`](tiller_store::SessionStore::claim_slot)):
//! of the processes sharing the store (a cluster's hosts on one PostgreSQL, a
//! host restarted on its SQLite file), the one whose claim wins fires it. A
//! slot that passed while no process ran, or more than [`LATEST_FIRE`] ago
//! when its host woke, is not fired late; a claim the store fails three times,
//! or a fire the triggers refuse, loses its slot (logged). Scheduled events
//! belong to no tenant. Clients cannot publish `schedule.…` topics.

use std::str::FromStr;
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};
use serde_json::json;
use tiller_runtime::Event;
use tokio_util::task::AbortOnDropHandle;

use crate::Supervisor;
use crate::definitions::Definitions;
use crate::trigger::Trigger;

/// The shortest `every`.
pub const MIN_EVERY: Duration = Duration::from_secs(1);

/// The longest `every` (a year).
pub const MAX_EVERY: Duration = Duration::from_secs(366 * 24 * 3600);

/// When a trigger fires on its own.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// Every so long, from the Unix epoch.
    Every(Duration),
    /// At a cron expression's times in a time zone.
    Cron {
        /// The expression, parsed.
        cron: Box<croner::Cron>,
        /// The expression as written.
        expression: String,
        /// Where its times are read.
        zone: TimeZone,
    },
}

impl Schedule {
    /// The schedule of `trigger`, if it has one; the field at fault and why,
    /// if it is unusable.
    pub fn of(trigger: &Trigger) -> Result<Option<Schedule>, (&'static str, String)> {
        match (&trigger.every, &trigger.cron, &trigger.timezone) {
            (None, None, None) => Ok(None),
            (None, None, Some(_)) => Err(("timezone", "a time zone goes with `cron`".to_owned())),
            (Some(_), Some(_), _) => Err((
                "every",
                "a trigger has `every` or `cron`, not both".to_owned(),
            )),
            (Some(_), None, Some(_)) => Err((
                "timezone",
                "`every` counts from the Unix epoch: a time zone goes with `cron`".to_owned(),
            )),
            (Some(every), None, None) => parse_every(every)
                .map(|every| Some(Schedule::Every(every)))
                .map_err(|message| ("every", message)),
            (None, Some(expression), zone) => {
                let cron = croner::Cron::from_str(expression)
                    .map_err(|error| ("cron", format!("not a cron expression: {error}")))?;
                let zone = match zone {
                    None => TimeZone::UTC,
                    Some(name) => TimeZone::get(name).map_err(|_| {
                        (
                            "timezone",
                            format!("`{name}` is not a time zone this machine knows (an IANA name such as Europe/Oslo)"),
                        )
                    })?,
                };
                let schedule = Schedule::Cron {
                    cron: Box::new(cron),
                    expression: expression.clone(),
                    zone,
                };
                if schedule.next_after(0).is_none() {
                    return Err(("cron", format!("`{expression}` never fires")));
                }
                Ok(Some(schedule))
            }
        }
    }

    /// The first slot after `after` (milliseconds since the Unix epoch), in
    /// milliseconds since the epoch; `None` when there is none.
    pub fn next_after(&self, after: i64) -> Option<i64> {
        match self {
            Schedule::Every(every) => {
                let every = i64::try_from(every.as_millis()).ok()?;
                after.div_euclid(every).checked_add(1)?.checked_mul(every)
            }
            Schedule::Cron { cron, zone, .. } => {
                let start = Timestamp::from_millisecond(after)
                    .ok()?
                    .to_zoned(zone.clone());
                let next: Zoned = cron.find_next_occurrence(&start, false).ok()?;
                Some(next.timestamp().as_millisecond())
            }
        }
    }

    /// The schedule as the event names it.
    fn describe(&self) -> String {
        match self {
            Schedule::Every(every) => format!("every {}", show_every(*every)),
            Schedule::Cron {
                expression, zone, ..
            } => format!("cron {expression} {}", zone.iana_name().unwrap_or("UTC")),
        }
    }

    /// The slot `at` as the event shows it: in the schedule's time zone.
    fn show_slot(&self, at: i64) -> String {
        let zone = match self {
            Schedule::Every(_) => TimeZone::UTC,
            Schedule::Cron { zone, .. } => zone.clone(),
        };
        Timestamp::from_millisecond(at)
            .map(|time| time.to_zoned(zone).to_string())
            .unwrap_or_default()
    }
}

/// `every` as written: a whole number and a unit.
fn parse_every(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!("`{text}` is not a period: a whole number and a unit (ms, s, m, h, d), such as 15m")
    };
    let digits = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let count: u64 = text[..digits].parse().map_err(|_| bad())?;
    let unit = match &text[digits..] {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let every = Duration::from_millis(count.checked_mul(unit).ok_or_else(bad)?);
    if !(MIN_EVERY..=MAX_EVERY).contains(&every) {
        return Err(format!("`{text}` is not from 1s to 366d"));
    }
    Ok(every)
}

fn show_every(every: Duration) -> String {
    let ms = every.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// How the topics of schedules' fires begin: a host takes no event of such a
/// topic from its clients (`POST /triggers/…`).
pub const SCHEDULE_TOPICS: &str = "schedule.";

/// How late past its slot a fire may still go out: a slot passed by more (the
/// machine slept, the clock jumped) is skipped.
pub const LATEST_FIRE: Duration = Duration::from_secs(60);

/// How often a slot's claim is tried when the store fails, a second apart.
const CLAIM_TRIES: u32 = 3;

/// The topic a scheduled trigger's fires are published as.
pub fn schedule_topic(agent: &str, index: usize) -> String {
    format!("{SCHEDULE_TOPICS}{agent}.{index}")
}

/// Fires the scheduled triggers of the latest version of each definition,
/// each slot once across the processes that share the supervisor's store; the
/// fires stop when it is dropped.
pub struct Schedules {
    _tasks: Vec<AbortOnDropHandle<()>>,
}

impl Schedules {
    /// Starts firing the schedules of `definitions` through `supervisor`'s
    /// event sink (the triggers it has attached).
    pub fn start(supervisor: &Supervisor, definitions: &Definitions) -> Schedules {
        let mut tasks = Vec::new();
        for file in definitions.latest() {
            for (index, trigger) in file.triggers.iter().enumerate() {
                let Ok(Some(schedule)) = Schedule::of(trigger) else {
                    continue;
                };
                // The topic its file gave it, made here for one built in code.
                let topic = schedule_topic(&file.name, index);
                let task = tokio::spawn(fire(supervisor.clone(), topic, schedule));
                tasks.push(AbortOnDropHandle::new(task));
            }
        }
        Schedules { _tasks: tasks }
    }
}

/// Fires `schedule` as `topic`, slot after slot.
async fn fire(supervisor: Supervisor, topic: String, schedule: Schedule) {
    let mut last = now_ms();
    loop {
        // The next slot after the later of the clock and the last slot: a
        // clock set back does not fire a slot twice, and slots missed while
        // asleep are not fired late.
        let after = now_ms().max(last);
        let Some(slot) = schedule.next_after(after) else {
            tracing::warn!(%topic, "the schedule fires no more");
            return;
        };
        let wait = u64::try_from(slot - after).unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        last = slot;
        let late = now_ms().saturating_sub(slot);
        if late > i64::try_from(LATEST_FIRE.as_millis()).unwrap_or(i64::MAX) {
            tracing::warn!(%topic, late_ms = late, "a schedule's slot passed while the host slept: skipped");
            continue;
        }
        if !claim(&supervisor, &topic, slot).await {
            continue;
        }
        let payload = json!({"schedule": schedule.describe(), "slot": schedule.show_slot(slot)});
        if let Err(error) = supervisor.publish(Event::new(topic.clone(), payload)) {
            tracing::warn!(%topic, %error, "a schedule's fire was refused");
        }
    }
}

/// Whether this host claims `slot`: tried again a second later while the
/// store fails, [`CLAIM_TRIES`] times in all.
async fn claim(supervisor: &Supervisor, topic: &str, slot: i64) -> bool {
    for tried in 1..=CLAIM_TRIES {
        match supervisor.store().claim_slot(topic, slot).await {
            Ok(claimed) => return claimed,
            Err(error) if tried == CLAIM_TRIES || !error.is_unavailable() => {
                tracing::warn!(%topic, %error, "a schedule's slot could not be claimed: not fired");
                return false;
            }
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    false
}

fn now_ms() -> i64 {
    i64::try_from(tiller_ai::now_ms()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn trigger(every: Option<&str>, cron: Option<&str>, zone: Option<&str>) -> Trigger {
        Trigger {
            every: every.map(str::to_owned),
            cron: cron.map(str::to_owned),
            timezone: zone.map(str::to_owned),
            ..Trigger::default()
        }
    }

    fn ms(time: &str) -> i64 {
        time.parse::<Timestamp>().unwrap().as_millisecond()
    }

    #[test]
    fn every_counts_whole_periods_from_the_epoch() {
        let every = Schedule::of(&trigger(Some("15m"), None, None))
            .unwrap()
            .unwrap();
        assert_eq!(
            every.next_after(ms("2026-11-29T10:07:00Z")),
            Some(ms("2026-11-29T10:15:00Z"))
        );
        assert_eq!(
            every.next_after(ms("2026-11-29T10:15:00Z")),
            Some(ms("2026-11-29T10:30:00Z"))
        );
        assert_eq!(every.describe(), "every 15m");
        assert_eq!(
            every.show_slot(ms("2026-11-29T10:15:00Z")),
            "2026-11-29T10:15:00+00:00[UTC]"
        );
    }

    #[test]
    fn cron_reads_its_hours_in_its_time_zone_summer_and_winter() {
        let nine = Schedule::of(&trigger(None, Some("0 9 * * *"), Some("Europe/Oslo")))
            .unwrap()
            .unwrap();
        // Winter: UTC+1; after the clocks went forward on 29 March: UTC+2.
        assert_eq!(
            nine.next_after(ms("2026-03-28T12:00:00Z")),
            Some(ms("2026-03-29T07:00:00Z"))
        );
        assert_eq!(
            nine.next_after(ms("2026-11-29T10:00:00Z")),
            Some(ms("2026-11-30T08:00:00Z"))
        );
        assert_eq!(nine.describe(), "cron 0 9 * * * Europe/Oslo");
        assert_eq!(
            nine.show_slot(ms("2026-11-30T08:00:00Z")),
            "2026-11-30T09:00:00+01:00[Europe/Oslo]"
        );
    }

    #[test]
    fn an_unusable_schedule_names_its_field() {
        let error = |every, cron, zone| Schedule::of(&trigger(every, cron, zone)).unwrap_err();
        assert_eq!(error(Some("15"), None, None).0, "every");
        assert_eq!(
            error(Some("0s"), None, None).1,
            "`0s` is not from 1s to 366d"
        );
        assert_eq!(error(Some("1w"), None, None).0, "every");
        assert_eq!(error(Some("1m"), Some("* * * * *"), None).0, "every");
        assert_eq!(error(Some("1m"), None, Some("UTC")).0, "timezone");
        assert_eq!(error(None, None, Some("UTC")).0, "timezone");
        assert_eq!(error(None, Some("61 * * * *"), None).0, "cron");
        assert_eq!(error(None, Some("0 9 31 2 *"), None).0, "cron");
        assert_eq!(
            error(None, Some("0 9 * * *"), Some("Mars/Olympus")).1,
            "`Mars/Olympus` is not a time zone this machine knows (an IANA name such as Europe/Oslo)"
        );
        assert!(Schedule::of(&Trigger::default()).unwrap().is_none());
    }
}
