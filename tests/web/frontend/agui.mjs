// Drives @ag-ui/client's HttpAgent against a streamengine app.
// node agui.mjs <url> <RunAgentInput messages as JSON> [--approve | --deny]
//   ->  one JSON line: error, event types, messages, result (and, when the run ended at an interrupt and an answer
//       was given, the resuming run's as "resumed").
import { HttpAgent } from '@ag-ui/client';

const [url, messagesJson, answer] = process.argv.slice(2);
const agent = new HttpAgent({ url, threadId: 'thread-1', initialMessages: JSON.parse(messagesJson) });

async function run(parameters) {
  const events = [];
  let error = null;
  let result = null;
  try {
    const finished = await agent.runAgent(parameters, {
      onEvent: ({ event }) => { events.push(event); },
    });
    result = finished.result ?? null;
  } catch (caught) {
    error = String(caught?.message ?? caught);
  }
  return { error, events, messages: structuredClone(agent.messages), result };
}

const first = await run({ runId: 'run-1' });
const interrupts = structuredClone(agent.pendingInterrupts ?? []);
let resumed = null;
if (answer && interrupts.length) {  // the next run answers every open interrupt (AG-UI's resume)
  const approved = answer === '--approve';
  resumed = await run({
    runId: 'run-2',
    resume: interrupts.map((interrupt) => ({
      interruptId: interrupt.id, status: 'resolved', payload: approved ? { approved } : { approved, reason: 'no' },
    })),
  });
}
process.stdout.write(JSON.stringify({ ...first, interrupts, resumed }) + '\n');
