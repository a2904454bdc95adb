// Drives lodger's AG-UI endpoint with @ag-ui/client's HttpAgent (its own SSE parsing,
// event verification and message assembly) and prints what it rendered as JSON.
// Usage: node ag_ui_client.mjs '{"url", "token", "session", "text", "approve"}'
// Runs the agent on a user message; when the run ends with an interrupt outcome, runs
// it again with resume entries answering every interrupt.
import { HttpAgent } from "@ag-ui/client";

const config = JSON.parse(process.argv[2]);
const agent = new HttpAgent({
  url: `${config.url}/v1/sessions/${config.session}/ag-ui`,
  headers: { Authorization: `Bearer ${config.token}` },
  threadId: config.session,
});

async function run(runId, parameters) {
  const events = [];
  const failures = [];
  await agent
    .runAgent(
      { runId, ...parameters },
      {
        onEvent: ({ event }) => {
          events.push(event);
        },
        onRunFailed: ({ error }) => {
          failures.push(String(error));
        },
      },
    )
    .catch((error) => failures.push(String(error)));
  const finished = events.find((e) => e.type === "RUN_FINISHED") ?? null;
  return { events, failures, finished };
}

agent.addMessage({ id: `user-${Date.now()}`, role: "user", content: config.text });
const runs = [await run("run-1", {})];
const outcome = runs[0].finished?.outcome;
if (outcome?.type === "interrupt") {
  const resume = outcome.interrupts.map((i) => ({
    interruptId: i.id,
    status: "resolved",
    payload: { approved: config.approve },
  }));
  runs.push(await run("run-2", { resume }));
}
process.stdout.write(JSON.stringify({ runs, messages: agent.messages }));
