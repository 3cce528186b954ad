import pytest

from tests.support.simulated_agent import SimulatedAgent


@pytest.fixture
def simulated_agent():
    agents = []

    def start(url, host_id, token, stages, hz=4.0):
        agent = SimulatedAgent(url, host_id, token, stages, hz)
        agent.start()
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()
